"""Networks. `build_models` picks MLPs for 2-D points and small conv nets for images."""

from ampgan.models.classifier import Backbone, Classifier, Head
from ampgan.models.wgan_gp import Critic, Generator

__all__ = ["Backbone", "Classifier", "Critic", "Generator", "Head"]
