"""The demo's guest wing: everything ``make demo`` needs that a real training run does not.

Owns the seeded synthetic world (``synth``), the tiny backbones with their locally trained
tokenizers (``tiny``), the backbone warm-up (``warmup``), the demo driver (``driver``) and its
report (``report``), and the ``llava-norm`` subcommands for them (``commands``, registered
through the ``llava_norm.commands`` entry point). It builds on the core package ``llava_norm``;
the core never imports it.
"""
