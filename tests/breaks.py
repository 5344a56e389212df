"""Break a feature on purpose and watch the test that names the break fail.

Each entry below edits one line of the package (the break), runs the test said to catch it, and
puts the line back. The run passes only if every test fails under its break, so the claims in
tests/README.md are checked, not just written. Not part of ``make test`` (each entry is a test
run of its own, so the whole list takes many minutes): ``make check-breaks``, or
``python tests/breaks.py NAME ...`` for some of them.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Break:
    name: str
    path: str  # the file edited, from the repository root
    old: str  # a line (or lines) that must occur exactly once
    new: str
    test: str  # the pytest node that must fail


BREAKS = [
    Break("seeds not resampled", "llava_norm/stats.py",
          "seeds = rng.integers(0, n_seeds, size=(m, n_seeds)) if n_seeds > 1 else np.zeros((m, 1), dtype=np.int64)",
          "seeds = np.tile(np.arange(n_seeds), (m, 1))",
          "tests/test_stats.py::test_the_bootstrap_draws_resample_seeds"),
    Break("no Student-t widening over seeds", "llava_norm/stats.py",
          "        low, high = min(low, t_interval.low), max(high, t_interval.high)", "        pass",
          "tests/test_stats.py::test_several_seeds_widen_to_students_t_of_the_per_seed_deltas"),
    Break("seeds_interval takes unequal unit counts", "llava_norm/stats.py",
          "    _same_units(rows, [len(r) for r in rows])", "    pass",
          "tests/test_stats.py::test_mismatched_units_are_refused"),
    Break("packed positions run on across samples", "llava_norm/data/packing.py",
          "            position_ids[r, at:at + n] = torch.arange(n)",
          "            position_ids[r, at:at + n] = torch.arange(at, at + n)",
          "tests/test_packing.py::test_changing_one_sample_leaves_the_others_unchanged"),
    Break("fused loss averaged per micro-batch", "llava_norm/model/loss.py",
          "    return total / num_items_in_batch", "    return total / max(len(targets), 1)",
          "tests/test_packed_training.py::test_packed_fused_training_equals_plain_training[full]"),
    Break("fused loss's hidden-state gradient scaled", "llava_norm/model/loss.py",
          "        return grad_hidden, grad_weight, None, None", "        return grad_hidden * 1.5, grad_weight, None, None",
          "tests/test_packed_training.py::test_packed_fused_training_equals_plain_training[full]"),
    Break("a checkpoint without its marker counts as complete", "llava_norm/train/rundir.py",
          "    return [p for _, p in sorted(found) if (p / COMPLETE_MARKER).is_file()]",
          "    return [p for _, p in sorted(found)]",
          "tests/test_resume.py::test_a_kill_during_a_save_resumes_from_the_checkpoint_before"),
    Break("a relaunch restarts instead of resuming", "llava_norm/train/run.py",
          "            result = trainer.train(resume_from_checkpoint=str(resume_from) if resume_from else None)",
          "            result = trainer.train(resume_from_checkpoint=None)",
          "tests/test_pipeline.py::test_a_yaml_edit_to_stage_2_reruns_that_stage_and_its_evaluation_only"),
    Break("a relaunch at the last step's checkpoint trains a step past it", "llava_norm/train/trainer.py",
          "        if self.state.global_step >= self.state.max_steps:  # resumed from the last step's checkpoint",
          "        if False:",
          "tests/test_run_logs.py::test_a_run_killed_mid_window_and_in_its_final_save_ends_as_an_uninterrupted_one"),
    Break("lr/<group> read after the scheduler stepped", "llava_norm/train/runlog.py",
          "        for name, lr in self.learning_rates.items():",
          "        for name, lr in {g['name']: g['lr'] for g in self.trainer.optimizer.param_groups}.items():",
          "tests/test_resume.py::test_each_groups_logged_learning_rate_is_the_one_its_update_used"),
    Break("train_loss over the last launch only", "llava_norm/train/trainer.py",
          "            logs[\"train_loss\"] = self.run_log.train_loss()", "            pass",
          "tests/test_relaunch.py::test_no_logged_throughput_counts_start_up_and_train_loss_spans_every_launch"),
    Break("train_loss after a checkpoint without log state divided by every step", "llava_norm/train/runlog.py",
          "max(self.trainer.state.global_step - self.losses_from, 1)", "max(self.trainer.state.global_step, 1)",
          "tests/test_relaunch.py::test_a_checkpoint_without_log_state_gives_train_loss_over_the_steps_after_it"),
    Break("the throughput clock starts before start-up", "llava_norm/train/runlog.py",
          "        self.clock: float | None = None  # this launch's first step start, then the last log (one RunLog a launch)",
          "        self.clock = time.perf_counter()",
          "tests/test_relaunch.py::test_no_logged_throughput_counts_start_up_and_train_loss_spans_every_launch"),
    Break("log windows restart at a relaunch", "llava_norm/train/runlog.py",
          "            self._restore(self.resumed_from)", "            pass",
          "tests/test_run_logs.py::test_a_run_killed_mid_window_and_in_its_final_save_ends_as_an_uninterrupted_one"),
    Break("one-time messages on every rank", "llava_norm/train/run.py",
          "    main_process_messages()\n", "",
          "tests/test_run_logs.py::test_a_run_killed_mid_window_and_in_its_final_save_ends_as_an_uninterrupted_one"),
    Break("a new W&B run each launch", "llava_norm/train/runlog.py",
          "            keep_wandb_run(output_dir)", "            pass",
          "tests/test_run_logs.py::test_a_run_killed_mid_window_and_in_its_final_save_ends_as_an_uninterrupted_one"),
    Break("the plan loses a layer's activations", "llava_norm/plan/memory.py",
          "            return self.outside_layers + sum(saved for saved, _ in self.layers)\n",
          "            return self.outside_layers + sum(saved for saved, _ in self.layers[:-1])\n",
          "tests/test_plan_measured.py::test_the_plan_matches_a_measured_forward_at_real_width"),
    Break("ZeRO-3's universal load keeps one shared step counter", "llava_norm/train/trainer.py",
          "                    state[\"step\"] = state[\"step\"].clone()", "                    pass",
          "tests/test_world_size.py::test_a_run_killed_on_one_number_of_processes_continues_on_another[stage2-zero3-1to2]"),
    Break("ZeRO-3's universal load keeps the first group's rates", "llava_norm/train/trainer.py",
          "                group.update({**settings, \"lr\": rate, \"initial_lr\": base})", "                pass",
          "tests/test_world_size.py::test_a_run_killed_on_one_number_of_processes_continues_on_another[stage2-zero3-1to2]"),
    Break("the grouped order depends on the number of processes", "llava_norm/data/sampler.py",
          "        self.megabatch_size = batch_size * world_size * grad_accum  # the global batch",
          "        self.megabatch_size = batch_size * world_size",
          "tests/test_world_size.py::test_a_run_killed_on_one_number_of_processes_continues_on_another[stage1-zero2-scale_learned-2to1]"),
    Break("a log window cut by the kill is not rescaled to the new number of processes", "llava_norm/train/runlog.py",
          "            loss = loss * world / saved_world", "            pass",
          "tests/test_world_size.py::test_a_run_killed_on_one_number_of_processes_continues_on_another[stage1-zero2-scale_learned-2to1]"),
    Break("train_loss takes the main process's own last window", "llava_norm/train/trainer.py",
          "            dist.all_reduce(window)\n", "",
          "tests/test_world_size.py::test_a_run_killed_on_one_number_of_processes_continues_on_another[stage1-zero2-scale_learned-2to1]"),
    Break("the check lets through a checkpoint with no recorded global batch, which the trainer refuses",
          "llava_norm/train/preflight.py",
          "    problem = global_batch_problem(saved, world, config.train.per_device_batch_size * world * accum)\n",
          "    problem = global_batch_problem(saved, world, config.train.per_device_batch_size * world * accum) "
          "if \"global_batch\" in saved else None\n",
          "tests/test_relaunch.py::test_llava_norm_check_says_a_launch_resumes_on_another_number_of_processes"),
    Break("DeepSpeed's universal load unpickles freely", "llava_norm/train/run.py",
          "        with weights_only_loads() if universal else contextlib.nullcontext():",
          "        with contextlib.nullcontext():",
          "tests/test_world_size.py::test_the_conversion_and_the_universal_load_unpickle_no_code"),
    Break("the conversion unpickles freely", "llava_norm/train/universal.py",
          "    with weights_only_loads():\n        ds_to_universal.main(", "    if True:\n        ds_to_universal.main(",
          "tests/test_world_size.py::test_the_conversion_and_the_universal_load_unpickle_no_code"),
    Break("train.compile compiles nothing", "llava_norm/model/compile.py",
          "        layer.compile(backend=backend)", "        pass",
          "tests/test_compile.py::test_a_compiled_run_compiles_every_layer_and_trains_as_the_eager_run"),
    Break("train.fused_loss_kernel not passed to the model", "llava_norm/train/trainer.py",
          '            inputs["loss_kind"], inputs["loss_kernel"] = self.loss_kind, self.loss_kernel',
          '            inputs["loss_kind"] = self.loss_kind',
          "tests/test_training_single.py::test_the_named_fused_loss_kernel_reaches_the_loss"),
    Break("the fused loss's chunks ignore autocast", "llava_norm/model/loss.py",
          "    dtype = _autocast_dtype(hidden.device.type) or weight.dtype", "    dtype = weight.dtype",
          "tests/test_fused_loss.py::test_under_autocast_fp32_weights_match_the_plain_path_in_bf16"),
    Break("train.save_steps 0 still saves checkpoints", "llava_norm/train/run.py",
          'save_strategy="steps" if t.save_steps else "no", save_steps=t.save_steps,',
          'save_strategy="steps", save_steps=t.save_steps or 1,',
          "tests/test_training_single.py::test_save_steps_zero_writes_no_checkpoint_and_the_final_model"),
    Break("compiled softmax's one-hot not subtracted", "llava_norm/model/loss.py",
          "                logits[torch.arange(len(target), device=logits.device), target] = (picked.exp() - 1).to(dtype)",
          "                pass",
          "tests/test_fused_loss.py::test_the_compiled_softmax_matches_the_plain_path[5]"),
    Break("a failed compile's written logits reused", "llava_norm/model/loss.py",
          "                if picked is None:  # its compile failed on this chunk: the logits may be part-written\n"
          "                    logits = part @ matmul_weight.T",
          "                pass",
          "tests/test_fused_loss.py::test_a_compile_failure_after_the_logits_were_written_recomputes_them"),
    Break("every error taken for a compile failure", "llava_norm/model/loss.py",
          "    return isinstance(error, tuple(kinds))", "    return True",
          "tests/test_fused_loss.py::test_an_error_running_the_compiled_softmax_is_raised_not_taken_for_a_compile_failure"),
    Break("dynamo switched off runs the fused function uncompiled", "llava_norm/model/loss.py",
          "        if self.fn is not None and torch._dynamo.config.disable:", "        if False:",
          "tests/test_fused_loss.py::test_with_dynamo_disabled_the_blocks_are_used_not_the_uncompiled_function"),
    Break("train.fused_loss_softmax not passed to the trainer", "llava_norm/train/run.py",
          "        loss_softmax=t.fused_loss_softmax,", "",
          "tests/test_packed_training.py::test_packed_fused_training_equals_plain_training[full]"),
    Break("train.cudnn_attention not applied", "llava_norm/train/run.py",
          "        torch.backends.cuda.enable_cudnn_sdp(t.cudnn_attention)", "        pass",
          "tests/test_training_single.py::test_train_cudnn_attention_false_reaches_torchs_switch"),
    Break("the profile's GPU time counts annotations", "llava_norm/train/profile.py",
          '               if row.device_type == DeviceType.CUDA and not getattr(row, "is_user_annotation", False)) / 1e6',
          "               if row.device_type == DeviceType.CUDA) / 1e6",
          "tests/test_training_single.py::test_the_profiles_gpu_time_counts_each_kernel_once"),
    Break("the fused term for the compiled softmax counts the eager blocks", "llava_norm/model/loss.py",
          "    blocks = 0 if compiled else min(", "    blocks = 0 if False else min(",
          "tests/test_fused_loss.py::test_the_plans_loss_term_is_the_h100s_measured_peak"),
    Break("the fused alternative's trace starts from the plain forward's record", "llava_norm/plan/memory.py",
          "                    record.clear()\n                    record.update(at_tower)\n",
          "                    pass\n",
          "tests/test_plan.py::test_one_tower_trace_for_both_loss_kinds_gives_each_kinds_own_trace[auto]"),
    Break("the plan ignores train.fused_loss_softmax", "llava_norm/plan/estimate.py",
          "    traced = trace_loss_kinds(model, batch, seq, batch * n_images_row, tokens_per_image, kinds, t.fused_loss_softmax)",
          "    traced = trace_loss_kinds(model, batch, seq, batch * n_images_row, tokens_per_image, kinds)",
          "tests/test_plan.py::test_the_fused_terms_blocks_are_counted_only_for_the_eager_softmax"),
    Break("a reused stage's decision runs the machine's checks", "llava_norm/reuse.py",
          "        if not decision.reuse:\n            check_paths(config)", "        if True:\n            check_paths(config)",
          "tests/test_layers.py::test_a_reused_stage_is_decided_without_model_code"),
    Break("a stage that would run skips the machine's checks", "llava_norm/reuse.py",
          "        if not decision.reuse:\n            check_paths(config)", "        if False:\n            check_paths(config)",
          "tests/test_pipeline.py::test_a_stage_that_would_run_gets_the_launchs_checks_before_it_launches"),
    Break("a stage's reuse decision skips its input files' checks", "llava_norm/config_checks.py",
          "INPUT_CHECKS = (_data_paths, _backbone_dirs, _projector, _deepspeed_file)", "INPUT_CHECKS = ()",
          "tests/test_pipeline.py::test_a_stage_decision_names_a_missing_input_by_its_config_and_key"),
    Break("a streamed launch's failure raised as a traceback", "llava_norm/pipeline.py",
          "        code = subprocess.run(command, cwd=REPO, env=environment_vars).returncode",
          "        code = subprocess.run(command, cwd=REPO, env=environment_vars, check=True).returncode",
          "tests/test_pipeline.py::test_a_failed_launch_stops_the_chain_with_the_steps_error"),
    Break("transformers imported to quiet it", "llava_norm/worker.py",
          '    if "transformers" in sys.modules:', "    if True:",
          "tests/test_layers.py::test_a_subcommand_that_loads_no_model_leaves_transformers_unloaded_and_quiet"),
    Break("a variable set for a block left in the caller's environment", "llava_norm/worker.py",
          "            os.environ.pop(name, None)", "            pass",
          "tests/test_layers.py::test_a_subcommand_that_loads_no_model_leaves_transformers_unloaded_and_quiet"),
    Break("transformers not quieted around a subcommand", "llava_norm/cli.py",
          "    with contextlib.nullcontext() if args.verbose else quiet_transformers():",
          "    with contextlib.nullcontext():",
          "tests/test_layers.py::test_a_subcommand_that_loads_no_model_leaves_transformers_unloaded_and_quiet"),
    Break("transformers left at its own log level", "llava_norm/worker.py",
          '    with environment_variable("TRANSFORMERS_VERBOSITY", "error"):',
          '    with environment_variable("TRANSFORMERS_VERBOSITY", "info"):',
          "tests/test_layers.py::test_a_subcommand_that_loads_no_model_leaves_transformers_unloaded_and_quiet"),
    Break("a failed launch's errors above its last lines not shown", "llava_norm/pipeline.py",
          "                named.setdefault(tail[0], None)  # it leaves the tail: kept once, in first-seen order",
          "                pass",
          "tests/test_pipeline.py::test_a_failed_launchs_errors_above_its_last_lines_are_shown_and_earlier_launches_are_not"),
    Break("a failed launch's report reads earlier launches in its log", "llava_norm/pipeline.py",
          "        handle.seek(start if start <= log.stat().st_size else 0)", "        handle.seek(0)",
          "tests/test_pipeline.py::test_a_failed_launchs_errors_above_its_last_lines_are_shown_and_earlier_launches_are_not"),
    Break("a failed launch's errors shown out of order", "llava_norm/pipeline.py",
          "    kept = list(named)\n", "    kept = list(named)[::-1]\n",
          "tests/test_pipeline.py::test_a_failed_launchs_errors_above_its_last_lines_are_shown_and_earlier_launches_are_not"),
    Break("a logged launch's output not written to its log", "llava_norm/pipeline.py",
          "        code = subprocess.run(command, cwd=REPO, env=environment_vars, stdout=handle,",
          "        code = subprocess.run(command, cwd=REPO, env=environment_vars, stdout=subprocess.DEVNULL,",
          "tests/test_pipeline.py::test_a_failed_launch_stops_the_chain_with_the_steps_error"),
    Break("an evaluation relaunch recomputes what the killed run predicted", "llava_norm/evaluation/runner.py",
          "    if config.overwrite:\n        if ranks.is_main:\n            store.clear()",
          "    if True:\n        if ranks.is_main:\n            store.clear()",
          "tests/test_eval_runner.py::test_killed_evaluation_resumes_to_the_same_metrics_without_double_counting"),
    Break("a data index reused under another tokenizer", "llava_norm/data/index.py",
          "        key.update(tokenizer=hashlib.sha256(serialised.encode()).hexdigest(), format=type(form).__name__,",
          "        key.update(format=type(form).__name__,",
          "tests/test_data_sources.py::test_index_is_reused_only_when_files_code_and_tokenizer_match"),
    Break("a cuDNN trainer figure retyped", "README.md", "made 3,317 tokens/s", "made 3,318 tokens/s",
          "tests/test_docs.py::test_readme_cudnn_attention_figures_are_the_profiled_runs"),
    Break("the compiled softmax never chosen on CUDA", "llava_norm/model/loss.py",
          "        compile_backend = SOFTMAX_BACKEND if _gpu(hidden.device) else None",
          "        compile_backend = None",
          "tests/test_fused_loss.py::test_the_softmax_is_compiled_on_cuda_only"),
    Break("a softmax compile failure raised into training", "llava_norm/model/loss.py",
          "            if not _compile_failure(error):", "            if True:",
          "tests/test_fused_loss.py::test_a_softmax_that_does_not_compile_falls_back_to_the_blocks_and_says_so_once"),
    Break("a malformed JSONL line stops the launch under skip", "llava_norm/train/preflight.py",
          "        problems += [f\"{SKIPPABLE}key '{key}': {error}\" for error in unreadable[:MAX_SHARD_LINES]]",
          "        problems += [f\"key '{key}': {error}\" for error in unreadable[:MAX_SHARD_LINES]]",
          "tests/test_check.py::test_a_malformed_jsonl_line_is_a_warning_under_skip_and_a_problem_under_error"),
    Break("a backbone name that is no repo id met as a traceback", "llava_norm/train/preflight.py",
          "    except ValueError as error:  # huggingface_hub's HFValidationError",
          "    except KeyError as error:  # huggingface_hub's HFValidationError",
          "tests/test_check.py::test_a_backbone_that_is_neither_a_folder_nor_a_repo_id_is_one_line"),
    Break("a stage script trains whatever stage its config says", "llava_norm/cli.py",
          "        if problem:\n            script = ",
          "        if False:\n            script = ",
          "tests/test_config.py::test_a_stage_script_refuses_the_other_stages_config"),
    Break("ZeRO's gather deprecation printed at every step", "llava_norm/train/deepspeed_setup.py",
          "    safe_deepspeed_loading()\n    quiet_zero_gather_deprecation()\n", "    safe_deepspeed_loading()\n",
          "tests/test_training.py::test_stage1_then_stage2_under_deepspeed[2]"),
    Break("transformers' model folders scanned twice (its 128-entry cache kept)", "llava_norm/worker.py",
          "functools.lru_cache(maxsize=None)(scan.__wrapped__)", "functools.lru_cache(maxsize=128)(scan.__wrapped__)",
          "tests/test_worker.py::test_the_command_line_has_transformers_scan_its_model_folders_once_with_the_same_tables"),
    Break("the widened scan cache gives other tables (a model folder dropped)", "llava_norm/worker.py",
          "functools.lru_cache(maxsize=None)(scan.__wrapped__)",
          "functools.lru_cache(maxsize=None)(lambda path: {k: v for k, v in scan.__wrapped__(path).items() "
          "if k != 'llama'})",
          "tests/test_worker.py::test_the_command_line_has_transformers_scan_its_model_folders_once_with_the_same_tables"),
    Break("the command line without the one-scan rule", "llava_norm/cli.py",
          "    die_with_launcher()\n    one_scan_of_transformers_models()\n", "    die_with_launcher()\n",
          "tests/test_worker.py::test_the_command_line_has_transformers_scan_its_model_folders_once_with_the_same_tables"),
    Break("an evaluation's settings mismatch met as a traceback", "llava_norm/cli.py",
          "    except SettingsMismatchError as error:  # every rank meets it alike: one says it",
          "    except KeyError as error:  # every rank meets it alike: one says it",
          "tests/test_eval_runner.py::test_finished_benchmarks_are_not_recomputed_and_changed_settings_are_refused"),
    Break("a pipeline arm whose stage file trains the other stage planned without a word", "llava_norm/pipeline.py",
          "    if problems:  # before any stage trains", "    if False:  # before any stage trains",
          "tests/test_pipeline.py::test_an_arm_whose_stage_file_trains_the_other_stage_is_refused_before_any_step"),
    Break("the fused loss's chunks computed on the meta device", "llava_norm/model/loss.py",
          "        if hidden.is_meta:  # a plan's trace", "        if False:  # a plan's trace",
          "tests/test_fused_loss.py::test_on_meta_the_chunks_are_skipped_and_backward_gives_what_cpu_gives"),
    Break("the system's python3 chosen whatever version the python3 on PATH is", "Makefile",
          '[ "$$("$$sys" -c "$$v")" = "$$(python3 -c "$$v" 2>/dev/null)" ]; then', "true; then",
          "tests/test_makefile.py::test_venv_interpreter_is_the_systems_only_where_it_is_the_same_python_and_can_make_a_venv"),
    Break("a system python3 that cannot make a venv chosen", "Makefile",
          "\"$$sys\" -c 'import ensurepip, venv' >/dev/null 2>&1 && \\", "true && \\",
          "tests/test_makefile.py::test_venv_interpreter_is_the_systems_only_where_it_is_the_same_python_and_can_make_a_venv"),
    Break("llava-norm check says only the first key the config refuses", "llava_norm/train/preflight.py",
          "        report.problems += _each_config_error(path, overrides, error)",
          "        report.problems.append(str(error))",
          "tests/test_check.py::test_every_problem_is_one_line_naming_its_key_file_or_variable"),
    Break("llava-norm check tries each override alone on the file", "llava_norm/train/preflight.py",
          "            if error_of([*taken, override]) is None:", "            if error_of([override]) is None:",
          "tests/test_check.py::test_every_problem_is_one_line_naming_its_key_file_or_variable"),
    Break("unlabelled checkpoints labelled by their last two parts alone", "llava_norm/analysis/common.py",
          "    while parts < max(", "    while False and parts < max(",
          "tests/test_analysis.py::test_unlabelled_checkpoints_get_labels_that_tell_them_apart"),
    Break("a merged LoRA model without its run's prompt settings", "llava_norm/model/builder.py",
          "    if settings is not None:\n        shutil.copyfile(", "    if False:\n        shutil.copyfile(",
          "tests/test_lora.py::test_merged_model_matches_unmerged"),
    Break("a universal copy loaded whatever files its checkpoint now holds", "llava_norm/train/universal.py",
          "    if marker.is_file() and json.loads(marker.read_text()) == source:",
          "    if marker.is_file():",
          "tests/test_world_size.py::test_a_universal_copy_counts_only_while_its_source_files_are_the_ones_it_was_made_from"),
    Break("the kept W&B run id winning over the one you set", "llava_norm/train/runlog.py",
          '    run_id = os.environ.get("WANDB_RUN_ID") or (path.read_text().strip() if path.is_file() else "")',
          '    run_id = (path.read_text().strip() if path.is_file() else "") or os.environ.get("WANDB_RUN_ID")',
          "tests/test_training_single.py::test_a_wandb_run_id_you_set_wins_and_is_kept_and_a_restart_makes_a_new_one"),
    Break("a checkpoint past train.max_steps refused only once training starts", "llava_norm/train/relaunch.py",
          "    if step is not None and 0 < last < step:", "    if False:",
          "tests/test_relaunch.py::test_checkpoint_with_another_config_is_refused_unless_allowed"),
    Break("the plan's LoRA adapters made on the CPU", "llava_norm/plan/estimate.py",
          '            with torch.device("meta"):\n                params.freeze_for_lora',
          "            if True:\n                params.freeze_for_lora",
          "tests/test_plan.py::test_lora_adapters_made_on_meta_are_the_ones_peft_moves_there"),
    Break("eval's headline printed as a fraction", "llava_norm/evaluation/benchmarks/base.py",
          "        return 100.0 * float(node)", "        return float(node)",
          "tests/test_eval_runner.py::test_the_command_prints_each_benchmarks_headline_as_the_table_heads_it"),
    Break("the install's stamp not naming its settings", "Makefile",
          "STAMP   := .venv/.installed-$(shell printf '%s' '$(TORCH) $(INSTALLER)' | cksum | cut -d' ' -f1)",
          "STAMP   := .venv/.installed",
          "tests/test_makefile.py::test_install_runs_again_when_its_torch_or_installer_changes_and_back"),
    Break("an install leaving the other settings' stamps", "Makefile",
          "\trm -f .venv/.installed*\n", "",
          "tests/test_makefile.py::test_install_runs_again_when_its_torch_or_installer_changes_and_back"),
    Break("a ZeRO stage pickled by early Python 3.11 refused on load", "llava_norm/train/universal.py",
          "fragment_address, (enum_member, \"builtins.getattr\")]", "fragment_address]",
          "tests/test_relaunch.py::test_a_zero_stage_pickled_by_early_python_311_loads_and_no_other_getattr_does"),
    Break("a checkpoint's getattr reads any attribute of an allowed class", "llava_norm/train/universal.py",
          "    if cls is ZeroStageEnum and isinstance(name, str) and name in cls.__members__:\n        return cls[name]",
          "    return getattr(cls, name)",
          "tests/test_relaunch.py::test_a_zero_stage_pickled_by_early_python_311_loads_and_no_other_getattr_does"),
    Break("a grid's stage file that trains the other stage passes the sweep's check", "llava_norm/sweep.py",
          "            if mismatch:  # its script would refuse it when the stage starts",
          "            if False:  # its script would refuse it when the stage starts",
          "tests/test_sweep.py::test_an_arm_whose_stage_file_trains_the_other_stage_is_refused_before_the_grid_runs"),
    Break("the learned scale a 0-dim tensor", "llava_norm/model/norm_align.py",
          "            self.scale = nn.Parameter(torch.full((1,), self.init_value))",
          "            self.scale = nn.Parameter(torch.tensor(self.init_value))",
          "tests/test_resume.py::test_killed_run_resumes_exactly[zero3-scale_learned-stage2-epoch2]"),
    Break("the fixed scale learned", "llava_norm/model/norm_align.py",
          '            self.register_buffer("scale", torch.full((1,), self.init_value))',
          "            self.scale = nn.Parameter(torch.full((1,), self.init_value))",
          "tests/test_resume.py::test_killed_run_resumes_exactly[packed-fused-zero3-scale_fixed-stage2-epoch1]"),
    Break("the plan's LoRA adapters left in the dtype they were made in", "llava_norm/plan/estimate.py",
          "                        getattr(module, name).to(weight.dtype)", "                        pass",
          "tests/test_plan.py::test_lora_adapters_made_on_meta_are_the_ones_peft_moves_there"),
    Break("model.scale_value auto never calibrated", "llava_norm/train/run.py",
          "    if needs_calibration(config):", "    if False:",
          "tests/test_world_size.py::test_a_run_killed_on_one_number_of_processes_continues_on_another[stage1-zero2-scale_learned-2to1]"),
    Break("stage 2's scale not taken from stage 1's projector", "llava_norm/train/run.py",
          "        load_projector(bundle.model, m.pretrained_projector)", "        pass",
          "tests/test_resume.py::test_killed_run_resumes_exactly[packed-fused-zero3-scale_fixed-stage2-epoch1]"),
]


def check(brk: Break) -> bool:
    """True if the test fails under the break (and the file is put back either way)."""
    path = ROOT / brk.path
    original = path.read_text()
    if original.count(brk.old) != 1:
        raise SystemExit(f"{brk.name}: {brk.path} no longer holds the line to break exactly once: {brk.old!r}")
    path.write_text(original.replace(brk.old, brk.new))
    try:
        run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:xdist", brk.test], cwd=ROOT,
                             capture_output=True, text=True)
    finally:
        path.write_text(original)
    return run.returncode == 1  # tests failed (not a usage error or an interrupted run)


def passes_unbroken(tests: list[str]) -> None:
    """Every named test passes before any break: one failing for another reason would count as
    having caught its break."""
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", *dict.fromkeys(tests)], cwd=ROOT,
                         capture_output=True, text=True)
    if run.returncode != 0:
        raise SystemExit("the named tests must pass before any break is applied:\n" + run.stdout[-3000:])


def main(names: list[str]) -> None:
    chosen = [b for b in BREAKS if not names or b.name in names]
    unknown = set(names) - {b.name for b in chosen}
    if unknown:
        raise SystemExit(f"no break named {sorted(unknown)}")
    passes_unbroken([b.test for b in chosen])
    missed = []
    for brk in chosen:
        caught = check(brk)
        print(f"{'caught' if caught else 'MISSED'}: {brk.name} -> {brk.test}", flush=True)
        if not caught:
            missed.append(brk.name)
    if missed:
        raise SystemExit(f"{len(missed)} break(s) no test caught: {missed}")


if __name__ == "__main__":
    main(sys.argv[1:])
