"""refplan.interop against the interop probe's findings: one test per defect.

Each test pins a promise of the module docstring that the probe found broken: a description is
mapped exactly or refused (a DTensor whose local shards are not its placements' split), a corrupt
description never hangs (a huge ``_StridedShard`` split factor) and never escapes as a bare Python
or pickle error (a corrupt ``.metadata``, corrupt chunk, dtype or EP-group fields, tensor subclasses
a state dict may hold), and nothing is approximated (a quantized tensor as dense bytes,
``owner_rank=True`` as rank 1).
"""

from __future__ import annotations

import os
import pickle
import re
import shutil
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from conftest import fill_shards, markers, megatron_meta

from refplan.errors import InputFileError, InvalidMapError, UnsupportedLayoutError
from refplan.interop import (
    dcp_element_sizes,
    dcp_storage_files,
    from_dcp_metadata,
    from_dtensor,
    from_megatron,
    maps_from_state_dict,
)

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
from torch.distributed.tensor import DeviceMesh, DTensor, Shard  # noqa: E402
from torch.distributed.tensor.placement_types import _StridedShard  # noqa: E402

pytestmark = pytest.mark.xdist_group("interop")


@contextmanager
def fake_rank(rank: int, world: int) -> Iterator[None]:
    """This process as ``rank`` of a fake process group of ``world`` ranks (nothing runs)."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    try:
        yield
    finally:
        dist.destroy_process_group()


_meta = megatron_meta


# ---------------------------------------------------------------------------------------------
# Defect 1: a DTensor whose local shards are not torch's even split of its placements.


def test_dtensor_from_local_with_uneven_shards_is_refused() -> None:
    """Rank 0 holds 1 row and rank 1 4 rows of a (5, 3) ``Shard(0)`` DTensor: the placements say
    3 and 2 rows, so each rank's map would ship the wrong rows. Each rank sees its own mismatch."""
    for rank, rows in ((0, 1), (1, 4)):
        with fake_rank(rank, 2):
            mesh = DeviceMesh("cpu", torch.arange(2))
            local = torch.zeros(rows, 3)
            dtensor = DTensor.from_local(local, mesh, [Shard(0)], shape=torch.Size((5, 3)), stride=(3, 1))
            want = (3, 3) if rank == 0 else (2, 3)
            words = (rf"^w: location {rank} \(this process, mesh coordinate \({rank},\)\) holds a local tensor of "
                     rf"shape \({rows}, 3\), .* shard of shape \({want[0]}, 3\) there: the DTensor's local shards do "
                     r"not follow torch's even split")
            with pytest.raises(UnsupportedLayoutError, match=words):
                from_dtensor(dtensor, parameter="w")
            with pytest.raises(UnsupportedLayoutError, match=r"^w: location"):
                maps_from_state_dict({"w": dtensor})
            # The even split torch itself makes (and a meta-device local tensor) is still mapped.
            even = DTensor.from_local(torch.zeros(want, device="meta"), mesh, [Shard(0)],
                                      shape=torch.Size((5, 3)), stride=(3, 1))
            assert from_dtensor(even).shard_shapes == {0: (3, 3), 1: (2, 3)}
    # A process outside the mesh holds nothing to compare: no check, the map from placements.
    with fake_rank(0, 4):
        outside = DTensor.from_local(torch.empty(0), DeviceMesh("cpu", torch.tensor([2, 3])), [Shard(0)],
                                     shape=torch.Size((5, 2)), stride=(2, 1))
        assert from_dtensor(outside).shard_shapes == {2: (3, 2), 3: (2, 2)}


# ---------------------------------------------------------------------------------------------
# Defect 2: a huge _StridedShard split factor.


@pytest.mark.timeout(20)
def test_strided_shard_huge_split_factor_is_fast_and_torchs() -> None:
    """torch pads the split-factor chunks with empty ones, so a factor above the extent is legal:
    coordinate 0 takes every one-row chunk. A factor of 2**40 must cost no loop over the factor
    (it hung); the result for a small factor above the extent is torch's own split."""
    for factor in (10**9, 2**40, 2**62):
        got = from_dtensor((4, 4), (2,), [_StridedShard(0, split_factor=factor)])
        assert got.shard_shapes == {0: (4, 4), 1: (0, 4)}, factor
    # Element for element against torch's own _split_tensor, for factors below, at and above the extent.
    full = markers((7, 2))
    for factor in (2, 3, 7, 9, 50):
        placement = _StridedShard(0, split_factor=factor)
        shards, _ = placement._split_tensor(torch.from_numpy(full), 3, with_padding=False)
        param_map = from_dtensor((7, 2), (3,), [placement])
        filled = fill_shards(param_map, full)
        for r, shard in enumerate(shards):
            assert param_map.shard_shapes[r] == tuple(shard.shape), (factor, r)
            np.testing.assert_array_equal(filled[r].reshape(shard.shape), shard.numpy(), err_msg=f"{factor} {r}")
    nested = from_dtensor((9, 2), (2, 2), [Shard(0), _StridedShard(0, split_factor=2**40)])
    assert nested.shard_shapes == {0: (5, 2), 1: (0, 2), 2: (4, 2), 3: (0, 2)}


# ---------------------------------------------------------------------------------------------
# Defect 3: a corrupt .metadata, or a directory that is not a DCP checkpoint.


@pytest.fixture(scope="module")
def saved_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> str:
    import torch.distributed.checkpoint as dcp

    path = str(tmp_path_factory.mktemp("ckpt"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"w": torch.zeros(8, 4)}, checkpoint_id=path, no_dist=True)
    return path


READERS: list[Callable[[Any], Any]] = [from_dcp_metadata, dcp_element_sizes, dcp_storage_files]


class _Opens:
    """Unpickled, calls ``open(path, "w")``: what a crafted checkpoint could run instead."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> Any:
        return (open, (self.path, "w"))


@pytest.mark.parametrize("reader", READERS, ids=lambda f: f.__name__)
def test_a_hostile_dcp_metadata_runs_nothing(saved_checkpoint: str, tmp_path: Any,
                                             reader: Callable[[Any], Any]) -> None:
    """torch's own reader unpickles ``.metadata`` with plain pickle, so a crafted one ran its code
    (here: created a file) before refplan refused it (an outside probe, 2026-12-07). refplan's
    reader refuses every global DCP metadata never names before looking it up."""
    from torch.distributed.checkpoint import FileSystemReader

    folder = tmp_path / "hostile"
    shutil.copytree(saved_checkpoint, folder)
    marker = tmp_path / "ran"
    for payload in (_Opens(str(marker)), [1, _Opens(str(marker))]):
        (folder / ".metadata").write_bytes(pickle.dumps(payload))
        for given in (str(folder), FileSystemReader(str(folder))):
            with pytest.raises(InvalidMapError, match=r"\.metadata: .*cannot be read: it names (io|builtins)\.open"):
                reader(given)
    assert not marker.exists()


@pytest.mark.parametrize("reader", READERS, ids=lambda f: f.__name__)
def test_corrupt_dcp_metadata_is_invalid_map_naming_the_file(saved_checkpoint: str, tmp_path: Any,
                                                             reader: Callable[[Any], Any]) -> None:
    raw = Path(saved_checkpoint, ".metadata").read_bytes()
    assert reader(saved_checkpoint)  # the good checkpoint is read
    cases = {
        "truncated": (raw[: len(raw) // 2], "cannot be read"),
        "empty": (b"", "cannot be read"),
        "garbage": (b"not a pickle", "cannot be read"),
        "dict": (pickle.dumps({"w": 1}), "holds a pickled dict, not the DCP Metadata"),
        "namespace": (pickle.dumps(SimpleNamespace()), r"cannot be read: it names types\.SimpleNamespace, which no "
                                                       "DCP metadata holds"),
    }
    for name, (data, words) in cases.items():
        folder = tmp_path / name
        shutil.copytree(saved_checkpoint, folder)
        (folder / ".metadata").write_bytes(data)
        with pytest.raises(InvalidMapError, match=rf"^{re.escape(str(folder))}/\.metadata: .*{words}"):
            reader(str(folder))
    from torch.distributed.checkpoint import FileSystemReader

    with pytest.raises(InvalidMapError, match=r"\.metadata: .*cannot be read"):
        reader(FileSystemReader(str(tmp_path / "garbage")))
    empty = tmp_path / "not_a_checkpoint"
    empty.mkdir()
    for given in (str(empty), empty, str(tmp_path / "missing")):
        with pytest.raises(InputFileError, match=rf"^{re.escape(os.fspath(given))}: not a DCP checkpoint \(no readable "
                                                 r"\.metadata\)") as info:
            reader(given)
        assert info.value.errno == 2


# ---------------------------------------------------------------------------------------------
# Defect 4: state-dict values that are tensors but no dense row-major shard of known shape.


def test_state_dict_sharded_tensor_and_lazy_parameters_are_unsupported() -> None:
    with fake_rank(0, 2):
        from torch.distributed._shard.sharded_tensor import empty as sharded_empty
        from torch.distributed._shard.sharding_spec import ChunkShardingSpec

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch._shard is deprecated
            sharded = sharded_empty(ChunkShardingSpec(dim=0, placements=["rank:0/cpu", "rank:1/cpu"]), 8, 4)
        with pytest.raises(UnsupportedLayoutError, match=r"^emb\.w: a ShardedTensor"):
            maps_from_state_dict({"ok": torch.zeros(2), "emb.w": sharded})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # lazy modules are experimental
        lazy = torch.nn.LazyLinear(4)
    with pytest.raises(UnsupportedLayoutError, match=r"^weight: an UninitializedParameter .* has no shape yet"):
        maps_from_state_dict(lazy)
    lazy(torch.zeros(1, 3))  # materialized: mapped as any module
    assert maps_from_state_dict(lazy).maps["weight"].shard_shapes == {0: (4, 3)}


def test_state_dict_megatron_sharded_tensors_are_refused_not_skipped() -> None:
    """A Megatron-Core sharded state dict (``model.sharded_state_dict()``: dist_checkpointing
    ``ShardedTensor``s, no ``torch.Tensor``) used to give empty maps and no error, since its values
    were skipped as non-tensors (an outside probe, 2026-12-07); with ``non_tensors="refuse"`` it
    said "not a tensor". Refused either way, naming the key; a ``ShardedObject`` is a non-tensor."""
    mapping = pytest.importorskip("megatron.core.dist_checkpointing.mapping")
    local = torch.arange(8.0).reshape(2, 4)
    sharded = mapping.ShardedTensor.from_rank_offsets("decoder.fc1.weight", local, (0, 0, 2), replica_id=0)
    for mode in ("skip", "refuse"):
        with pytest.raises(UnsupportedLayoutError, match=r"^decoder\.fc1\.weight: a Megatron-Core ShardedTensor "
                                                         r"\(dist_checkpointing"):
            maps_from_state_dict({"ok": torch.zeros(2), "decoder.fc1.weight": sharded}, non_tensors=mode)  # type: ignore[arg-type]
    state = mapping.ShardedObject("extra", {"step": 3}, (1,), (0,), replica_id=0)
    assert set(maps_from_state_dict({"ok": torch.zeros(2), "extra": state}).maps) == {"ok"}
    with pytest.raises(UnsupportedLayoutError, match=r"^extra: a ShardedObject value is not a tensor"):
        maps_from_state_dict({"extra": state}, non_tensors="refuse")


# ---------------------------------------------------------------------------------------------
# Defect 5: corrupt metadata fields are InvalidMapError naming the parameter.


def _dcp(chunks: Any, properties: Any = "float32") -> Any:
    from torch.distributed.checkpoint.metadata import Metadata, TensorProperties, TensorStorageMetadata

    props = TensorProperties(dtype=torch.float32) if properties == "float32" else properties
    return Metadata({"layer.w": TensorStorageMetadata(props, torch.Size([4]), chunks)})


def test_corrupt_dcp_and_megatron_fields_name_the_parameter() -> None:
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, TensorProperties

    ok = [ChunkStorageMetadata(offsets=torch.Size([0]), sizes=torch.Size([4]))]
    with pytest.raises(InvalidMapError, match=r"^layer\.w: the stored chunks are None, not a list"):
        from_dcp_metadata(_dcp(None))
    with pytest.raises(InvalidMapError, match=r"^layer\.w: chunk 1 is 7, not a ChunkStorageMetadata"):
        from_dcp_metadata(_dcp([*ok, 7]), location="chunk")
    for props in (None, TensorProperties(dtype=None)):
        with pytest.raises(InvalidMapError, match=r"^layer\.w: the stored properties\.dtype is None, not a torch"):
            dcp_element_sizes(_dcp(ok, props))
    assert dcp_element_sizes(_dcp(ok)) == {"layer.w": 4}

    def ep(group: Any) -> Any:
        return _meta(name="experts.w", owner_rank=0, is_ep=True, expert_parallel_group_ranks=group)

    # A numpy array is a list of ranks like any other: two EP ranks are refused for what they are.
    with pytest.raises(UnsupportedLayoutError, match=r"^experts\.w on rank 0: .*\(2 EP ranks\)"):
        from_megatron([[ep(np.array([0, 1]))]])
    assert from_megatron([[ep(np.array([0]))]])["experts.w"].shard_shapes == {0: (4, 2)}
    for group, words in ((2, "expert_parallel_group_ranks 2 is not a list of ranks"),
                         (np.array(3), "is not a list of ranks"),
                         ([0, 1.5], r"holds 1\.5, which is not a rank"),
                         ([0, 0], r"lists a rank twice")):
        with pytest.raises(InvalidMapError, match=rf"^experts\.w on rank 0: .*{words}"):
            from_megatron([[ep(group)]])


# ---------------------------------------------------------------------------------------------
# Defect 6: nothing approximated: a quantized tensor, a non-integer owner_rank.


def test_quantized_tensors_and_non_integer_owner_ranks_are_refused() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # quantized tensor creation is deprecated
        q = torch.quantize_per_channel(torch.randn(4, 4), torch.ones(4), torch.zeros(4, dtype=torch.long), 0,
                                       torch.quint8)
    with pytest.raises(UnsupportedLayoutError, match=r"^fc\.q: a quantized tensor \(torch\.quint8"):
        maps_from_state_dict({"fc.q": q})
    for owner, rank in ((True, 1), (0.0, 0), (np.bool_(False), 0), ("0", 0)):
        with pytest.raises(InvalidMapError, match=r"^w on rank \d: owner_rank .* is not a rank"):
            from_megatron({rank: [_meta(owner_rank=owner)]})
    for owner in (0, np.int64(0), -1, None):  # the reporting rank, or none
        assert from_megatron({0: [_meta(owner_rank=owner)]})["w"].shard_shapes == {0: (4, 2)}


def test_an_empty_parameter_whose_local_shard_is_narrowed_is_accepted() -> None:
    """FSDP2 narrows any shard of a tensor with no elements to length 0 on its shard axis: a (4, 0)
    parameter is (0, 0) locally where the even split says (1, 0). Both hold nothing; the check
    refused every model with such a parameter (a review of the check)."""
    with fake_rank(1, 4):
        mesh = DeviceMesh("cpu", torch.arange(4))
        empty = DTensor.from_local(torch.zeros(0, 0), mesh, [Shard(0)], shape=torch.Size((4, 0)), stride=(1, 1))
        assert from_dtensor(empty).shard_shapes[1] == (1, 0)
        wrong = DTensor.from_local(torch.zeros(2, 3), mesh, [Shard(0)], shape=torch.Size((4, 3)), stride=(3, 1))
        with pytest.raises(UnsupportedLayoutError):  # a shard with elements is still compared
            from_dtensor(wrong)


def test_another_readers_errors_are_its_own(tmp_path: Path) -> None:
    """A ``FileSystemReader`` subclass that reads other files (Hugging Face safetensors) raised
    refplan's "<dir>/.metadata ... corrupt" about a file it never opened."""
    from torch.distributed.checkpoint import HuggingFaceStorageReader

    (tmp_path / "model.safetensors").write_bytes(b"\0" * 3)
    with pytest.raises(Exception) as raised:
        from_dcp_metadata(HuggingFaceStorageReader(str(tmp_path)))
    assert ".metadata" not in str(raised.value), raised.value
