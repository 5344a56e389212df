"""One training run from a RunConfig: build, freeze, data, Trainer, resume, final save.

Owns the order of operations and the run directory layout:
``output_dir/checkpoint-N/`` (resumable: model, optimizer, scheduler, RNG, step),
``output_dir/model/`` and ``output_dir/projector.safetensors`` (``llava_norm.train.final``),
``output_dir/config.yaml`` and ``output_dir/train_summary.json`` (``complete: true`` once the
final model is written). What a relaunch on an existing output_dir does is decided first, before
any model or data loads (``llava_norm.train.relaunch``). A run killed after its last checkpoint
resumes from it, trains nothing, and writes the final model and summary from it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import AutoConfig, TrainingArguments, set_seed

from llava_norm.config import RunConfig, effective_grad_accum, lora_vision_mode, to_yaml
from llava_norm.config_schema import NORM_ARMS, ConfigError, packing_llm_problem, world_size
from llava_norm.data.collate import collate
from llava_norm.data.conversation import conversation_tokenizer
from llava_norm.data.dataset import BadSampleError, SupervisedDataset, count_by_cause
from llava_norm.data.packing import PackedDataset, collate_packed
from llava_norm.data.rows import WHOLE_FILE
from llava_norm.files import finish_removals, write_atomically
from llava_norm.layout import CONFIG_FILE, MODEL_DIR, PROJECTOR_FILE, PROJECTOR_PREFIX
from llava_norm.model.builder import ModelSpec, build_model
from llava_norm.model.compile import compile_layers
from llava_norm.plan import format_plan, make_plan
from llava_norm.train.deepspeed_setup import forget_earlier_runs, prepare_deepspeed
from llava_norm.train.final import save_final
from llava_norm.train.params import freeze_backbones, freeze_for_lora
from llava_norm.train.profile import StepProfiler
from llava_norm.train.record import complete_finished_run, finish_record, start_record
from llava_norm.train.launch_lock import sole_launch
from llava_norm.train.relaunch import clear_outputs, plan_launch
from llava_norm.train.rundir import RUN_CONFIG, SKIPPED, SUMMARY, data_state
from llava_norm.train.runlog import kept_wandb_run, main_process_messages
from llava_norm.train.trainer import LlavaNormTrainer
from llava_norm.train.universal import (UNIVERSAL_WAIT_S, loads_naming_refusals, remove_universal_copies,
                                         universal_checkpoint, weights_only_loads)

log = logging.getLogger(__name__)
CALIBRATION_IMAGES = 16  # model.scale_value auto: the images c is measured on


def load_projector(model, path: str | Path) -> None:
    """Load stage-1 projector (and norm) weights; plain tensors, before DeepSpeed partitions anything."""
    state = load_file(str(path))
    projector = model.model.multi_modal_projector
    expected = set(projector.state_dict())
    got = {k[len(PROJECTOR_PREFIX):] if k.startswith(PROJECTOR_PREFIX) else k: v for k, v in state.items()}
    if set(got) != expected:
        raise ValueError(f"{path}: projector keys {sorted(got)} do not match this model's {sorted(expected)} "
                         "(same norm_alignment arm and projector_type as stage 1?)")
    projector.load_state_dict(got)


def needs_calibration(config: RunConfig) -> bool:
    """A scaling arm with ``scale_value: auto`` measures c at the start of stage 1; stage 2 takes
    it from stage 1's projector file."""
    m = config.model
    return NORM_ARMS[m.norm_alignment].scale_calibrated and m.scale_value == "auto" and config.train.stage == 1 \
        and not m.pretrained_projector


@torch.no_grad()
def calibrate_scale(model, dataset, collate_fn, images: int = CALIBRATION_IMAGES) -> float:
    """c = T / the mean norm of the projected visual tokens of the dataset's first ``images``
    images (the same on every rank: same weights, same rows); sets the layer and returns c."""
    rows, at = [], 0
    while sum(len(r.pixel_values) for r in rows) < images and at < len(dataset):
        row = dataset[at]
        at += 1
        if row.pixel_values is not None and len(row.pixel_values):
            rows.append(row)
    if not rows:
        raise ValueError("model.scale_value auto: the training data has no image to calibrate c on")
    pixels = collate_fn(rows)["pixel_values"][:images]
    was_training = model.training
    model.eval()
    features = model.model.get_image_features(pixel_values=pixels)
    features = features.pooler_output if hasattr(features, "pooler_output") else features
    projector = model.model.multi_modal_projector
    # get_image_features includes the scaling layer: divide its current factor back out.
    tokens = torch.cat([f.reshape(-1, f.shape[-1]) for f in features]) / projector.norm.scale.detach()
    value = model.config.text_norm / float(tokens.float().norm(dim=-1).mean())
    projector.norm.set_value(value)
    model.train(was_training)
    return value


def print_startup_plan(config: RunConfig) -> None:
    """The launch's ``llava-norm plan``, for this launch's processes and GPU, before any weights load.

    Informational: a plan that cannot be made (a backbone family the meta device cannot trace)
    is said in one line and the run goes on; a config the plan finds no row fits (ConfigError:
    ``data.pack_max_tokens`` below an image's tokens) stops it, as ``llava-norm check`` does."""
    world = world_size()
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    memory = name = None
    if torch.cuda.is_available():
        memory = torch.cuda.get_device_properties(0).total_memory / 2 ** 30
        name = torch.cuda.get_device_name(0)
    try:
        plan = make_plan(config, per_node, max(1, world // per_node), memory, name, alternatives=memory is not None)
    except ConfigError:  # every sample would be skipped for its length: said before any weights load
        raise
    except Exception as error:  # noqa: BLE001 - otherwise the plan informs; it never stops a launch
        print(f"[llava-norm] no plan for this launch: {type(error).__name__}: {str(error).splitlines()[0]}")
        return
    print(format_plan(plan, config.train.output_dir), flush=True)


def use_bf16(precision: str) -> bool:
    if precision == "auto":
        return torch.cuda.is_available()
    return precision == "bf16"


def training_arguments(config: RunConfig, universal: bool = False) -> TrainingArguments:
    """``universal``: DeepSpeed loads the resumed checkpoint in its universal format."""
    t = config.train
    deepspeed = t.deepspeed
    if universal:
        deepspeed = json.loads(Path(t.deepspeed).read_text())
        deepspeed.setdefault("checkpoint", {})["load_universal"] = True
    grad_accum = effective_grad_accum(t, world_size())
    return TrainingArguments(
        output_dir=t.output_dir, run_name=t.run_name, seed=t.seed, data_seed=t.seed,
        num_train_epochs=t.epochs, max_steps=t.max_steps,
        per_device_train_batch_size=t.per_device_batch_size, gradient_accumulation_steps=grad_accum,
        learning_rate=config.optim.lr, weight_decay=config.optim.weight_decay,
        lr_scheduler_type=config.optim.scheduler, warmup_steps=config.optim.warmup_ratio,
        max_grad_norm=config.optim.max_grad_norm,
        bf16=use_bf16(t.precision), use_cpu=not torch.cuda.is_available(),
        activation_checkpointing=t.gradient_checkpointing,
        gradient_checkpointing_kwargs={"use_reentrant": False} if t.gradient_checkpointing else None,
        deepspeed=deepspeed, save_strategy="steps" if t.save_steps else "no", save_steps=t.save_steps,
        save_total_limit=None,
        logging_steps=t.logging_steps, report_to=t.report_to, remove_unused_columns=False,
        dataloader_num_workers=config.data.num_workers, ddp_find_unused_parameters=False,
        disable_tqdm=False, **({"ddp_timeout": UNIVERSAL_WAIT_S} if universal else {}),
    )


class LaunchCheckError(RuntimeError):
    """What ``llava-norm check`` found wrong with this launch, one problem per line."""


def run_training(config: RunConfig, check=None) -> Path | None:
    """Train, resume or (for a finished run) do nothing; returns the model dir, or None if done already.
    ``check``: the launch's preflight (``llava_norm.train.preflight``), run by each node's first
    process before anything loads; its problems stop the launch. One launch at a time in the
    output folder (``launch_lock``): a second is refused before it reads the folder."""
    with sole_launch(config.train.output_dir):
        return _run_training(config, check)


def _run_training(config: RunConfig, check) -> Path | None:
    t = config.train
    main_process_messages()
    plan = plan_launch(config)  # before any model or data loads: refusals cost nothing
    if check is not None and plan.action != "done" and int(os.environ.get("LOCAL_RANK", "0")) == 0:
        report = check()
        if not report.ok:
            raise LaunchCheckError("\n".join(report.problems))
        for warning in report.warnings:
            log.warning("launch check: %s", warning, extra={"every_rank": True})  # this node's
    if plan.action == "done":
        if int(os.environ.get("RANK", "0")) == 0:
            out = Path(t.output_dir)
            complete_finished_run(config, {"model": out / MODEL_DIR, "projector": out / PROJECTOR_FILE})
            print(f"[llava-norm] {plan.message}")
        return None
    if t.restart:
        clear_outputs(config)
    forget_earlier_runs()
    for difference in plan.differences:
        log.warning("resuming with a changed config: %s", difference)
    if t.deepspeed:
        prepare_deepspeed()
    if int(os.environ.get("RANK", "0")) == 0:
        print_startup_plan(config)
    set_seed(t.seed)
    m = config.model
    if config.data.packing:  # a hub id's family is known from its config alone: refuse before any weights load
        llm_config = AutoConfig.from_pretrained(m.llm, trust_remote_code=m.trust_remote_code)
        problem = packing_llm_problem(llm_config.model_type)
        if problem:
            raise ConfigError(problem)
    bundle = build_model(ModelSpec(
        vision_tower=m.vision_tower, llm=m.llm, norm_alignment=m.norm_alignment, projector_type=m.projector_type,
        vision_feature_layer=m.vision_feature_layer, vision_feature_select_strategy=m.vision_feature_select_strategy,
        gwc_clamp=m.gwc_clamp, scale_value=m.scale_value, attn_implementation=m.attn_implementation,
        trust_remote_code=m.trust_remote_code, seed=t.seed,
    ))
    if m.pretrained_projector:
        load_projector(bundle.model, m.pretrained_projector)
    if config.lora.enabled:
        freeze_for_lora(bundle.model, config.lora, lora_vision_mode(config))
    else:
        freeze_backbones(bundle.model, t.stage, t.train_vision_tower)
    if t.compile:
        compile_layers(bundle.model, t.compile_backend)
    if t.cudnn_attention is not None:  # a process-wide switch: this process trains one model
        torch.backends.cuda.enable_cudnn_sdp(t.cudnn_attention)
    d = config.data
    encoder = conversation_tokenizer(bundle, d.prompt_format, dict(d.template_kwargs))
    max_length = min(d.max_length, d.pack_max_tokens) if d.packing else d.max_length
    # a DeepSpeed checkpoint saved on another number of processes resumes from its universal form
    saved_world = (data_state(plan.checkpoint) or {}).get("world_size") if plan.checkpoint else None
    universal = bool(t.deepspeed and saved_world not in (None, world_size()))
    args = training_arguments(config, universal)
    # One process per node reads the corpus and writes the row indexes (data.index); the others
    # wait, then map what it wrote from the datasets cache (its file lock covers a shared cache).
    with args.main_process_first(local=True, desc="data index"):
        dataset = SupervisedDataset(d.mixture, encoder, bundle.image_processor, max_length, d.image_aspect,
                                    d.on_bad_sample, d.length_estimate, system_prompt=d.system_prompt,
                                    image_placement=d.image_placement, exact_lengths=d.packing)
    if t.stage == 1 and not dataset.has_image.any():  # its steps would run with every gradient 0
        raise BadSampleError(f"data.mixture: none of its {len(dataset.has_image)} usable rows has an image, and "
                             "stage 1 trains only the projector and norm layer, which no text-only row reaches")
    pad_id = bundle.tokenizer.pad_token_id

    def collate_fn(examples):
        return collate(examples, pad_id, "right")

    train_dataset, train_collate = dataset, collate_fn
    if d.packing:
        train_dataset = PackedDataset(dataset, d.pack_max_tokens, seed=t.seed)
        if d.group_by_modality_length:
            log.info("data.packing: rows are shuffled whole; data.group_by_modality_length does not apply")
        # transformers' flash-attention path finds packed samples only in a batch of one row
        one_row = m.attn_implementation.startswith("flash_attention")

        def train_collate(packs):
            return collate_packed(packs, pad_id, one_row=one_row)

    if needs_calibration(config):
        value = calibrate_scale(bundle.model, dataset, collate_fn)
        if int(os.environ.get("RANK", "0")) == 0:
            print(f"[llava-norm] model.scale_value auto: c = T / mean norm of the projected visual tokens of "
                  f"{CALIBRATION_IMAGES} training images = {value:.6g} (stored with the checkpoint)")
    trainer = LlavaNormTrainer(
        model=bundle.model, args=args, train_dataset=train_dataset,
        data_collator=train_collate, loss_kind=t.loss, loss_kernel=t.fused_loss_kernel,
        loss_softmax=t.fused_loss_softmax,
        optim_config=config.optim, group_by_modality_length=config.data.group_by_modality_length,
        norm_stats_steps=t.norm_stats_steps, keep_checkpoints=t.save_total_limit,
        checkpoint_files={RUN_CONFIG: to_yaml(config)},
    )
    if plan.checkpoint:  # refuse a resume the data cannot continue before any record is rewritten
        trainer.check_data_order(plan.checkpoint)
    out = Path(t.output_dir)
    if t.profile_steps:
        trainer.add_callback(StepProfiler(*t.profile_steps, out))
    resume_from = plan.checkpoint
    if universal:  # the global process 0 converts, into this run's folder; the others wait, then check
        with args.main_process_first(local=False, desc="universal checkpoint"):
            with loads_naming_refusals():
                resume_from = universal_checkpoint(plan.checkpoint, out, convert=args.process_index == 0)
    if trainer.args.should_save:
        out.mkdir(parents=True, exist_ok=True)
        finish_removals(out)  # checkpoints rotated out, or a restart's trash, that a kill left half deleted
        # the record first: a folder holding it is a run's, which train.restart may clear
        record = start_record(config, plan.differences, resuming=plan.checkpoint is not None)
        write_atomically(out / CONFIG_FILE, to_yaml(config), sole_writer=True)  # process 0 alone
    if plan.checkpoint:
        log.info("resuming from %s", plan.checkpoint)
    # report_to "all" is resolved by TrainingArguments
    with kept_wandb_run(out if trainer.args.should_save and "wandb" in trainer.args.report_to else None):
        with weights_only_loads() if universal else contextlib.nullcontext():  # DeepSpeed's universal load
            with loads_naming_refusals():
                result = trainer.train(resume_from_checkpoint=str(resume_from) if resume_from else None)
    model_dir = save_final(trainer, bundle, config)
    if universal and trainer.args.should_save:  # a resume at the last step saved no checkpoint to clear it
        remove_universal_copies(out)
    draws = trainer.all_skips(out)
    if trainer.args.should_save:
        skipped = unique_skips(dataset.rejected, draws)
        write_atomically(out / SKIPPED, "".join(json.dumps(r) + "\n" for r in skipped), sole_writer=True)
        by_cause = count_by_cause(skipped)
        summary = {"complete": True, "global_step": trainer.state.global_step,
                   "steps_this_launch": trainer.state.global_step - trainer._initial_global_step,
                   # the metrics' train_loss is over every step of the run (runlog); result.training_loss is
                   # transformers' mean over this launch's steps
                   "resumed_from": str(plan.checkpoint) if plan.checkpoint else None,
                   "train_loss": result.metrics["train_loss"],
                   "rows_rejected_at_load": len(dataset.rejected), "rows_adjusted_at_load": dataset.adjusted, "rows_skipped_when_drawn": len(skipped) - len(dataset.rejected),
                   "skipped_by_cause": by_cause, "log_history": trainer.state.log_history}
        # Put in place whole, as every file here: a relaunch reads the summary as the run's end.
        write_atomically(out / SUMMARY, json.dumps(summary, indent=2), sole_writer=True)
        finish_record(config, record, {"model": model_dir, "projector": out / PROJECTOR_FILE})
        causes = ", ".join(f"{cause} {n}" for cause, n in by_cause.items()) or "none"
        print(f"[llava-norm] stage {t.stage} done: {trainer.state.global_step} steps "
              f"({summary['steps_this_launch']} in this launch); {skipped_phrase(skipped)} skipped ({causes}), "
              f"listed in {out / SKIPPED}; model in {model_dir}")
    return model_dir


def skipped_phrase(skipped: list[dict]) -> str:
    """``"3 bad rows and 1 whole file or shard"``: a record of a whole file (an unreadable shard)
    stands for every row in it, so it is not counted as one row."""
    wholes = sum(1 for r in skipped if r["row"] == WHOLE_FILE)
    rows = len(skipped) - wholes
    phrase = f"{rows} bad row{'' if rows == 1 else 's'}"
    return phrase + (f" and {wholes} whole file{'' if wholes == 1 else 's'} or shard{'' if wholes == 1 else 's'}"
                     if wholes else "")


def unique_skips(rejected: list[dict], draws: list[dict]) -> list[dict]:
    """One record per bad row: load-time rejections, then rows found bad when drawn (a bad image
    is met again every epoch and by every rank that draws it; ``draws`` counts the meetings)."""
    merged = {(r["file"], r["row"], r["cause"]): {**r, "draws": 0} for r in rejected}
    for record in draws:
        merged.setdefault((record["file"], record["row"], record["cause"]), {**record, "draws": 0})["draws"] += 1
    return list(merged.values())
