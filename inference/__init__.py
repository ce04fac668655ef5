"""Inference plane: model pools, workers, the scheduler, the vLLM client, generations."""
