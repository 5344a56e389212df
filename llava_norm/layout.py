"""Names that writers and readers in several layers agree on: a run's files and the projector's
place in a saved model.

Owns only names. A training run writes its resolved config and stage 1's projector under these
names; evaluation, the diagnostics and the pipeline read them back; the config checks and the
training code find the projector's weights in a checkpoint by its parameter prefix.
"""

CONFIG_FILE = "config.yaml"  # in a run's output_dir: the resolved config it trained with
TRAINER_STATE = "trainer_state.json"  # in each checkpoint, the Trainer's own (its global_step among others)
COMPLETE_MARKER = "checkpoint_complete"  # in each checkpoint: written last, once every rank saved
MODEL_DIR = "model"  # in a run's output_dir: the saved model, written when the run ends
PROJECTOR_FILE = "projector.safetensors"  # in a run's output_dir: projector + norm weights (stage 2 starts here)
PROJECTOR_MODULE = "multi_modal_projector"  # the projector (and its norm layer) inside LlavaNormModel
PROJECTOR_PREFIX = f"model.{PROJECTOR_MODULE}."  # its parameters' names in a saved model
NORM_PREFIX = f"{PROJECTOR_PREFIX}norm."  # the norm-alignment layer's parameters
# What a projector file records of the run that trained it (safetensors metadata, all strings):
# stage 2 compares the first four with its own config.
PROJECTOR_ORIGIN = ("norm_alignment", "projector_type", "vision_tower", "llm", "text_norm")
# Set in the environment of a launch the pipeline (or a sweep) makes: an interrupted stage then
# says that rerunning the chain resumes it (the chain decides whether to restart, not the launch).
CHAIN_LAUNCH = "LLAVA_NORM_CHAIN_LAUNCH"
