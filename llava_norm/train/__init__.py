"""Train stage of the data flow: freezing, learning-rate groups, the HF Trainer subclass, runs."""
