"""The API as typed models: the single source of truth for the CRDs.

Each kind is a pydantic model whose JSON schema becomes the CRD's OpenAPI schema; the
cross-field rules exist twice, as pydantic validators (for the CLI and tests) and as CEL
rules in the schema (for admission), and the tests hold the two to the same catalog.
"""

from vllm_operator.models.base import ApiModel, Condition
from vllm_operator.models.gpu_node import GPUNode, GPUNodeSpec, GPUNodeStatus
from vllm_operator.models.inference_benchmark import (
    InferenceBenchmark,
    InferenceBenchmarkSpec,
    InferenceBenchmarkStatus,
)
from vllm_operator.models.inference_service import (
    InferenceService,
    InferenceServiceSpec,
    InferenceServiceStatus,
)
from vllm_operator.models.inference_tuning import (
    InferenceTuning,
    InferenceTuningSpec,
    InferenceTuningStatus,
)
from vllm_operator.models.model_cache import ModelCache, ModelCacheSpec, ModelCacheStatus

__all__ = [
    "ApiModel",
    "Condition",
    "GPUNode",
    "GPUNodeSpec",
    "GPUNodeStatus",
    "InferenceBenchmark",
    "InferenceBenchmarkSpec",
    "InferenceBenchmarkStatus",
    "InferenceService",
    "InferenceServiceSpec",
    "InferenceServiceStatus",
    "InferenceTuning",
    "InferenceTuningSpec",
    "InferenceTuningStatus",
    "ModelCache",
    "ModelCacheSpec",
    "ModelCacheStatus",
]
