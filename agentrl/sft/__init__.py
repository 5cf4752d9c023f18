"""Supervised fine-tuning on chat transcripts, through the same chat template and token path as RL."""
