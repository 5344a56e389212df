"""Data stage of the data flow: prompt formats, tokenisation with labels, datasets, batching."""
