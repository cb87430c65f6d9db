"""The application wing: model, training loop, fine-tuning, data, checkpoints, HF import/export."""
