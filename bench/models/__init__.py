"""Models: the factories of both tracks (vision, text), their losses and metrics (losses), central
pre-training (pretrain) and where tensors live (torch_device). A factory takes the Dataset and keyword
parameters and registers itself in bench.registry.MODELS."""
from bench.models.build import build_model, classifier_head, structure_only, update_names, weights_wanted

__all__ = ["build_model", "classifier_head", "structure_only", "update_names", "weights_wanted"]
