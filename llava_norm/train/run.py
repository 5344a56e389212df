"""One training run from a RunConfig: build, freeze, data, Trainer, resume, final save.

Owns the order of operations and the run directory layout:
``output_dir/checkpoint-N/`` (resumable: model, optimizer, scheduler, RNG, step),
``output_dir/model/`` (final model + tokenizer + image processor, safetensors; with LoRA the
base model plus ``adapter_*`` files, layout in ``llava_norm.model.lora``),
``output_dir/projector.safetensors`` (projector and norm layer, what stage 2 starts from),
``output_dir/config.yaml`` and ``output_dir/train_summary.json``.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import TrainingArguments, set_seed

from llava_norm.config import RunConfig, effective_grad_accum, lora_vision_mode, to_yaml
from llava_norm.data.collate import collate
from llava_norm.data.conversation import conversation_tokenizer
from llava_norm.data.dataset import SupervisedDataset
from llava_norm.model.builder import Bundle, ModelSpec, build_model
from llava_norm.model.lora import split_saved_model
from llava_norm.train.params import freeze_backbones, freeze_for_lora
from llava_norm.train.trainer import LlavaNormTrainer, complete_checkpoints

log = logging.getLogger(__name__)
PROJECTOR_PREFIX = "model.multi_modal_projector."


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


def resolve_resume(resume: str, output_dir: str) -> str | None:
    if resume == "none":
        return None
    if resume == "auto":
        complete = complete_checkpoints(output_dir)
        return str(complete[-1]) if complete else None
    if not Path(resume).is_dir():
        raise FileNotFoundError(f"train.resume: checkpoint dir not found: {resume}")
    return resume


def skip_cpu_inference_comm_op() -> None:
    """On CPU, keep DeepSpeed from compiling its shared-memory all-reduce op at start-up.

    Why: DeepSpeed's CPU backend JIT-compiles that C++ op whenever its comm layer starts
    (about 22 s on 2 cores, again in every new environment, and only with a C++ compiler
    present), yet only its inference engine's all-reduce uses it; ZeRO training reduces
    through torch.distributed. DeepSpeed builds an op only where ``__compatible_ops__``
    allows it, so marking this one incompatible skips the build and nothing else changes.
    """
    if torch.cuda.is_available():
        return
    import deepspeed.ops
    from deepspeed.ops.op_builder.cpu import ShareMemCommBuilder

    deepspeed.ops.__compatible_ops__[ShareMemCommBuilder.NAME] = False


def use_bf16(precision: str) -> bool:
    if precision == "auto":
        return torch.cuda.is_available()
    return precision == "bf16"


def training_arguments(config: RunConfig) -> TrainingArguments:
    t = config.train
    grad_accum = effective_grad_accum(t, int(os.environ.get("WORLD_SIZE", "1")))
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
        deepspeed=t.deepspeed, save_strategy="steps", save_steps=t.save_steps, save_total_limit=None,
        logging_steps=t.logging_steps, report_to=t.report_to, remove_unused_columns=False,
        dataloader_num_workers=config.data.num_workers, ddp_find_unused_parameters=False,
        disable_tqdm=False,
    )


def save_final(trainer: LlavaNormTrainer, bundle: Bundle, config: RunConfig) -> Path:
    out = Path(config.train.output_dir)
    model_dir = out / "model"
    trainer.save_model(str(model_dir))  # gathers ZeRO-3 shards into safetensors
    if trainer.args.should_save:
        if config.lora.enabled:
            split_saved_model(model_dir, bundle.model)
        bundle.tokenizer.save_pretrained(model_dir)
        bundle.image_processor.save_pretrained(model_dir)
        state = load_file(str(model_dir / "model.safetensors"))
        save_file({k: v for k, v in state.items() if k.startswith(PROJECTOR_PREFIX)}, str(out / "projector.safetensors"))
    return model_dir


def run_training(config: RunConfig) -> Path:
    t = config.train
    set_seed(t.seed)
    m = config.model
    bundle = build_model(ModelSpec(
        vision_tower=m.vision_tower, llm=m.llm, norm_alignment=m.norm_alignment, projector_type=m.projector_type,
        vision_feature_layer=m.vision_feature_layer, vision_feature_select_strategy=m.vision_feature_select_strategy,
        gwc_clamp=m.gwc_clamp, attn_implementation=m.attn_implementation, trust_remote_code=m.trust_remote_code,
        seed=t.seed,
    ))
    if m.pretrained_projector:
        load_projector(bundle.model, m.pretrained_projector)
    if config.lora.enabled:
        freeze_for_lora(bundle.model, config.lora, lora_vision_mode(config))
    else:
        freeze_backbones(bundle.model, t.stage, t.train_vision_tower)
    if t.deepspeed:
        skip_cpu_inference_comm_op()
    encoder = conversation_tokenizer(bundle, config.data.prompt_format, dict(config.data.template_kwargs))
    dataset = SupervisedDataset(config.data.mixture, encoder, bundle.image_processor, config.data.max_length,
                                config.data.image_aspect, config.data.on_bad_sample, config.data.length_estimate,
                                system_prompt=config.data.system_prompt)
    pad_id = bundle.tokenizer.pad_token_id
    trainer = LlavaNormTrainer(
        model=bundle.model, args=training_arguments(config), train_dataset=dataset,
        data_collator=lambda examples: collate(examples, pad_id, "right"),
        optim_config=config.optim, group_by_modality_length=config.data.group_by_modality_length,
        norm_stats_steps=t.norm_stats_steps, keep_checkpoints=t.save_total_limit,
    )
    out = Path(t.output_dir)
    if trainer.args.should_save:
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.yaml").write_text(to_yaml(config))
    resume = resolve_resume(t.resume, t.output_dir)
    if resume:
        log.info("resuming from %s", resume)
    result = trainer.train(resume_from_checkpoint=resume)
    model_dir = save_final(trainer, bundle, config)
    skipped = trainer.total_skipped()
    if trainer.args.should_save:
        summary = {"global_step": trainer.state.global_step, "train_loss": result.training_loss,
                   "rows_rejected_at_load": len(dataset.rejected), "samples_skipped_in_training": skipped,
                   "first_rejections": dataset.rejected[:20], "first_skips": trainer.skipped_samples[:20],
                   "log_history": trainer.state.log_history}
        (out / "train_summary.json").write_text(json.dumps(summary, indent=2))
        print(f"[llava-norm] stage {t.stage} done: {trainer.state.global_step} steps; "
              f"{len(dataset.rejected)} malformed rows rejected, {skipped} bad samples skipped; model in {model_dir}")
    return model_dir
