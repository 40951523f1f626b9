"""Trained models that PyPI wheels ship as package data, with real data from installed
packages: ``workbench.trained.get("mobilenet_v2")`` (see registry.py). Nothing is downloaded."""

from .files import WeightFile
from .registry import TRAINED, TaskSpec, TrainedModel, get

__all__ = ["TRAINED", "TaskSpec", "TrainedModel", "WeightFile", "get"]
