"""refplan: the reference planner for affine resharding transfers with batch replica selection."""

from __future__ import annotations

__version__ = "0.1.0"

from .errors import (
    AffineTransferError,
    InputFileError,
    InvalidMapError,
    InvalidReplicaPolicyError,
    PolicyRaisedError,
    UnsupportedLayoutError,
)
from .limits import PlanBudget
from .maps import (
    AffinePiece,
    ParamAffineMap,
    block_gather_map,
    contiguous_split_map,
    replicate,
    replicated_map,
    segmented_map,
    sub_param_map,
)
from .plan import PlanStatistics, TransferPlan, TransferSegment
from .planner import plan_transfer, plan_transfers
from .requests import (
    ReplicaAnswer,
    ReplicaCandidate,
    ReplicaPart,
    ReplicaPolicy,
    ReplicaRequest,
    ReplicaSelectionRequest,
    TransferEndpoints,
)
from .verify import BatchVerdict, Verdict, verify_plan, verify_plans

__all__ = [
    "AffinePiece",
    "AffineTransferError",
    "BatchVerdict",
    "InputFileError",
    "InvalidMapError",
    "InvalidReplicaPolicyError",
    "ParamAffineMap",
    "PlanBudget",
    "PlanStatistics",
    "PolicyRaisedError",
    "ReplicaAnswer",
    "ReplicaCandidate",
    "ReplicaPart",
    "ReplicaPolicy",
    "ReplicaRequest",
    "ReplicaSelectionRequest",
    "TransferEndpoints",
    "TransferPlan",
    "TransferSegment",
    "UnsupportedLayoutError",
    "Verdict",
    "block_gather_map",
    "contiguous_split_map",
    "plan_transfer",
    "plan_transfers",
    "replicate",
    "replicated_map",
    "segmented_map",
    "sub_param_map",
    "verify_plan",
    "verify_plans",
]
