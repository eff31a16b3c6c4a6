"""ampgan's own networks: MLPs for 2-D points, small conv nets for images. Each is the default
`_target_` of a model config (conf/model/); a user's own net takes its place the same way."""

from ampgan.models.classifier import Backbone, Classifier, Head
from ampgan.models.wgan_gp import Critic, Generator
from ampgan.models.zoo import CausalTransformer, ResNet, VisionTransformer

__all__ = ["Backbone", "CausalTransformer", "Classifier", "Critic", "Generator", "Head", "ResNet", "VisionTransformer"]
