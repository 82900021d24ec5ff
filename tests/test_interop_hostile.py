"""refplan.interop against hostile, corrupt or surprising descriptions (the interop audit's findings).

Each test pins one promise of the module docstring: a description is mapped exactly or refused;
corrupt metadata is ``InvalidMapError`` naming the parameter (and rank or chunk); a layout that
cannot be pinned down is ``UnsupportedLayoutError``; a returned map is one the planner accepts;
a caller's bad argument is ``TypeError`` / ``ValueError``. DCP's file-name rank is checked
against torch's own ``FileSystemWriter`` numbering of a sub-group save, in one process.
"""

from __future__ import annotations

import warnings
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
import pytest
from conftest import markers, megatron_meta

from refplan.errors import AffineTransferError, InvalidMapError, UnsupportedLayoutError
from refplan.interop import (
    dcp_file_rank,
    dcp_storage_files,
    from_dcp_metadata,
    from_dtensor,
    from_megatron,
    maps_from_state_dict,
)
from refplan.planner import plan_transfer

torch = pytest.importorskip("torch")
from torch.distributed.tensor import Partial, Replicate, Shard  # noqa: E402
from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset  # noqa: E402

pytestmark = pytest.mark.xdist_group("interop")


# ---------------------------------------------------------------------------------------------
# DCP helpers.


def _metadata(chunks: dict[str, tuple[Any, list[tuple[Any, Any]]]],
              storage: dict[tuple[str, tuple[int, ...]], str] | None = None) -> Any:
    """``Metadata`` as a corrupt ``.metadata`` file may unpickle it: chunk offsets and sizes are set
    as given (any Python objects), not through ``torch.Size``."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import (
        ChunkStorageMetadata,
        Metadata,
        MetadataIndex,
        TensorProperties,
        TensorStorageMetadata,
    )

    def chunk(offsets: Any, sizes: Any) -> Any:
        c = ChunkStorageMetadata.__new__(ChunkStorageMetadata)
        object.__setattr__(c, "offsets", offsets)
        object.__setattr__(c, "sizes", sizes)
        return c

    entries = {}
    for fqn, (size, cs) in chunks.items():
        entry = TensorStorageMetadata(TensorProperties(dtype=torch.float32), torch.Size((1,)),
                                      [chunk(o, s) for o, s in cs])
        object.__setattr__(entry, "size", size)
        entries[fqn] = entry
    data = None if storage is None else {
        MetadataIndex(fqn, off): _StorageInfo(path, 0, 1) for (fqn, off), path in storage.items()
    }
    return Metadata(entries, storage_data=data)


class _ChunkResolver:
    def __init__(self, tensors: dict[str, Any]) -> None:
        self.tensors = tensors

    def resolve_data(self, item: Any) -> Any:
        chunk = item.tensor_data.chunk
        index = tuple(slice(o, o + s) for o, s in zip(chunk.offsets, chunk.sizes))
        return self.tensors[item.index.fqn][index].contiguous()


def _save_on_group(path: Any, shape: tuple[int, ...], group_size: int) -> None:
    """What ``dcp.save(state, process_group=group)`` writes for a ``Shard(0)`` DTensor on a mesh of
    the group's ``group_size`` ranks: every step is DCP's own (``DefaultSavePlanner``,
    ``FileSystemWriter``), and the plans are listed in group-rank order, as the coordinator gathers
    them over the group. ``FileSystemWriter.prepare_global_plan`` names each file by that position."""
    from torch.distributed.checkpoint import DefaultSavePlanner, FileSystemWriter
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex, TensorProperties
    from torch.distributed.checkpoint.planner import SavePlan, TensorWriteData, WriteItem, WriteItemType

    plans = []
    for position in range(group_size):
        sizes, offsets = _compute_local_shape_and_global_offset(shape, (group_size,), [position], [Shard(0)])
        plans.append(SavePlan([WriteItem(
            index=MetadataIndex("w", torch.Size(offsets)), type=WriteItemType.SHARD,
            tensor_data=TensorWriteData(chunk=ChunkStorageMetadata(torch.Size(offsets), torch.Size(sizes)),
                                        properties=TensorProperties(dtype=torch.float32), size=torch.Size(shape)),
        )]))
    plans, metadata = DefaultSavePlanner(flatten_state_dict=False).create_global_plan(plans)
    writer = FileSystemWriter(str(path), single_file_per_rank=True, thread_count=1)
    writer.set_up_storage_writer(True)
    plans = writer.prepare_global_plan([writer.prepare_local_plan(p) for p in plans])
    tensors = {"w": torch.from_numpy(markers(shape))}
    results = [writer.write_data(p, _ChunkResolver(tensors)).wait() for p in plans]  # type: ignore[arg-type]
    writer.finish(metadata, results)


# ---------------------------------------------------------------------------------------------
# Defect 1: the rank in a .distcp name is the rank in the saving process group.


def test_dcp_file_rank_is_the_group_rank_and_group_ranks_translates_it(tmp_path: Any) -> None:
    """Global ranks 2 and 3 save on ``new_group([2, 3])``: the files are ``__0_0``/``__1_0``. Without
    ``group_ranks`` the map names the group ranks 0, 1; with it, the global ranks of the DTensor."""
    _save_on_group(tmp_path, (4, 2), 2)
    assert dcp_storage_files(str(tmp_path)) == ["__0_0.distcp", "__1_0.distcp"]
    assert sorted(from_dcp_metadata(str(tmp_path))["w"].shard_shapes) == [0, 1]
    saved = from_dtensor((4, 2), (2,), [Shard(0)], mesh_locations=[2, 3])
    assert from_dcp_metadata(str(tmp_path), group_ranks=[2, 3])["w"] == saved
    assert from_dcp_metadata(str(tmp_path), group_ranks=np.array([2, 3]))["w"] == saved
    assert from_dcp_metadata(str(tmp_path), group_ranks=(np.int64(2), 3))["w"] == saved
    # a group whose ranks are not in ascending order: group rank i is group_ranks[i]
    assert from_dcp_metadata(str(tmp_path), group_ranks=[5, 1])["w"] == \
        from_dtensor((4, 2), (2,), [Shard(0)], mesh_locations=[5, 1])
    # the whole world saving: group_ranks = range(world) is the identity
    assert from_dcp_metadata(str(tmp_path), group_ranks=range(2))["w"] == from_dcp_metadata(str(tmp_path))["w"]


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_dcp_group_ranks_with_a_real_single_process_save(tmp_path: Any) -> None:
    """A real ``dcp.save`` by one process (the group of one rank, whatever its global rank) writes
    ``__0_0.distcp``; ``group_ranks=[7]`` says global rank 7 wrote it."""
    import torch.distributed.checkpoint as dcp

    dcp.save({"w": torch.arange(6.0).reshape(3, 2)}, checkpoint_id=str(tmp_path), no_dist=True)
    assert dcp_storage_files(str(tmp_path)) == ["__0_0.distcp"]
    assert from_dcp_metadata(str(tmp_path), group_ranks=[7])["w"].shard_shapes == {7: (3, 2)}


def test_dcp_group_ranks_refusals(tmp_path: Any) -> None:
    _save_on_group(tmp_path, (4, 2), 2)
    path = str(tmp_path)
    for bad in ([0, True], [0, 1.0], ["0", "1"], [0, None]):
        with pytest.raises(TypeError, match="group_ranks"):
            from_dcp_metadata(path, group_ranks=bad)
    for not_a_list in (3, "01", b"01", {0: 1}):
        with pytest.raises(TypeError, match="group_ranks"):
            from_dcp_metadata(path, group_ranks=not_a_list)
    with pytest.raises(ValueError, match=r"group_ranks lists rank 2 twice"):
        from_dcp_metadata(path, group_ranks=[2, 2])
    with pytest.raises(ValueError, match=r"group_ranks.*-1"):
        from_dcp_metadata(path, group_ranks=[-1, 2])
    with pytest.raises(ValueError, match=r"group_ranks.*at least one"):
        from_dcp_metadata(path, group_ranks=[])
    for location in ("chunk", "file"):
        with pytest.raises(ValueError, match=r"group_ranks.*location='rank'"):
            from_dcp_metadata(path, location=location, group_ranks=[2, 3])
    # a file of group rank 1, but the group given has one rank: the checkpoint is not that group's
    with pytest.raises(InvalidMapError, match=r"w: .*'__1_0\.distcp'.*group rank 1.*group_ranks has 1 rank"):
        from_dcp_metadata(path, group_ranks=[4])
    # Metadata never written has no files, so there is no group rank to translate
    unwritten = _metadata({"w": ((4,), [((0,), (4,))])})
    with pytest.raises(ValueError, match=r"group_ranks.*never written"):
        from_dcp_metadata(unwritten, group_ranks=[0])


def test_dcp_docstrings_say_group_rank() -> None:
    """The number in a file name is documented as the rank in the group given to ``dcp.save``."""
    for doc in (from_dcp_metadata.__doc__, dcp_file_rank.__doc__):
        assert doc is not None and "process group" in doc and "group_ranks" in doc


# ---------------------------------------------------------------------------------------------
# Defect 3: chunks that do not cover the tensor.


@pytest.mark.parametrize("location", ["rank", "chunk", "file"])
def test_dcp_chunks_that_leave_part_of_the_tensor_unstored_are_refused(location: str) -> None:
    for chunks in ([((0, 0), (2, 2))], []):
        storage = {("w", o): f"__{i}_0.distcp" for i, (o, _) in enumerate(chunks)}
        md = _metadata({"w": ((4, 2), chunks)}, storage)
        with pytest.raises(InvalidMapError, match=r"^w: the stored chunks hold [04] of the 8 elements"):
            from_dcp_metadata(md, location=location)  # type: ignore[arg-type]
    # nothing to store: a tensor of no elements with no chunks is a map (of no locations)
    empty = from_dcp_metadata(_metadata({"e": ((0, 2), [])}, {}), location=location)["e"]  # type: ignore[arg-type]
    assert empty.logical_shape == (0, 2) and not empty.shard_shapes


def test_dcp_covering_chunks_plan() -> None:
    """The check is arithmetic on distinct holdings: replicas (the same chunk twice) count once."""
    md = _metadata({"w": ((4, 2), [((0, 0), (2, 2)), ((2, 0), (2, 2)), ((0, 0), (2, 2))])})
    stored = from_dcp_metadata(md, location="chunk")["w"]
    plan_transfer(from_dtensor((4, 2), (1,), [Replicate()]), stored)


# ---------------------------------------------------------------------------------------------
# Defect 4: corrupt chunk geometry is InvalidMapError.


@pytest.mark.parametrize(("size", "offsets", "sizes", "what"), [
    ((4, 2), (-2, 0), (4, 2), r"chunk 0 offsets"),
    ((4, 2), (0, 0), (-4, 2), r"chunk 0 sizes"),
    ((4, 2), (0.0, 0), (4, 2), r"chunk 0 offsets"),
    ((4, 2), (0, 0), (4, True), r"chunk 0 sizes"),
    ((4, 2), 7, (4, 2), r"chunk 0 offsets"),
    ((-4, 2), (0, 0), (4, 2), r"size"),
    ((4.0, 2), (0, 0), (4, 2), r"size"),
    ((4, 2), (-10**5000, 0), (4, 2), r"chunk 0 offsets"),
])
def test_dcp_corrupt_chunk_geometry_is_invalid_map(size: Any, offsets: Any, sizes: Any, what: str) -> None:
    md = _metadata({"w": (size, [(offsets, sizes)])})
    with pytest.raises(InvalidMapError, match=rf"^w: {what}"):
        from_dcp_metadata(md, location="chunk")


def test_megatron_corrupt_shapes_are_invalid_map() -> None:
    for shape in ((-2, 4), (2.0, 4), (2, True)):
        with pytest.raises(InvalidMapError, match=r"^w on rank 0: shape"):
            from_megatron([[_meta(shape=shape)]])
    for sizes in ([5, -1], [2.0, 2], "22"):
        bad = _meta(shape=(4, 2), is_tp=True, tensor_parallel_group_ranks=[0])
        bad.partition_sizes = sizes
        with pytest.raises(InvalidMapError, match=r"^w on rank 0: partition_sizes"):
            from_megatron([[bad]])


# ---------------------------------------------------------------------------------------------
# Defect 5: dcp_file_rank reads only the names FileSystemWriter writes.


def test_dcp_file_rank_hostile_names() -> None:
    for name in ("__01_0.distcp", "__1_00.distcp", "__\u0663_0.distcp", "__1_\u0660.distcp", "__+1_0.distcp",
                 "__1_0.distcp\n", "__\uff11_0.distcp", "__" + "7" * 5000 + "_0.distcp",
                 "__1_" + "7" * 5000 + ".distcp", "__" + "9" * 19 + "_0.distcp"):
        assert dcp_file_rank(name) is None, name
    assert dcp_file_rank("__0_0.distcp") == 0 and dcp_file_rank("__10_12.distcp") == 10
    assert dcp_file_rank("__" + "9" * 18 + "_0.distcp") == 10**18 - 1  # the longest rank read
    assert dcp_file_rank("dir\\__5_0.distcp") == 5 and dcp_file_rank("a/b/__5_0.distcp") == 5
    for path in (PurePosixPath("__3_0.distcp"), Path("ckpt") / "__3_0.distcp"):
        assert dcp_file_rank(path) == 3
    with pytest.raises(TypeError, match="dcp_file_rank"):
        dcp_file_rank(3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="dcp_file_rank"):
        dcp_file_rank(b"__3_0.distcp")  # type: ignore[arg-type]


def test_dcp_rank_of_a_hostile_file_name_is_refused_by_name() -> None:
    for name in ("__" + "7" * 5000 + "_0.distcp", "__01_0.distcp"):
        md = _metadata({"w": ((4,), [((0,), (4,))])}, {("w", (0,)): name})
        with pytest.raises(UnsupportedLayoutError, match="is not named __") as info:
            from_dcp_metadata(md)
        assert len(str(info.value)) < 500  # the hostile name is cut, not printed whole
    # two files claiming rank 1 through a leading zero would have been one rank holding two chunks
    md = _metadata({"w": ((4,), [((0,), (2,)), ((2,), (2,))])},
                   {("w", (0,)): "__1_0.distcp", ("w", (2,)): "__01_0.distcp"})
    with pytest.raises(UnsupportedLayoutError, match=r"'__01_0\.distcp' is not named"):
        from_dcp_metadata(md)


# ---------------------------------------------------------------------------------------------
# Defect 6: Partial on a 0-axis tensor.


def test_partial_on_a_zero_axis_tensor_is_unsupported() -> None:
    for placements in ([Partial()], [Replicate(), Partial("max")]):
        with pytest.raises(UnsupportedLayoutError, match=r"^loss_scale: mesh axis \d: Partial"):
            from_dtensor((), (2,) * len(placements), placements, parameter="loss_scale")
    with pytest.raises(ValueError, match="0-axis tensor cannot be sharded"):
        from_dtensor((), (2,), [Shard(0)], parameter="loss_scale")
    with pytest.raises(TypeError, match="placement"):
        from_dtensor((), (2,), ["S(0)"], parameter="loss_scale")
    assert from_dtensor((), (2,), [Replicate()]).shard_shapes == {0: (), 1: ()}


# ---------------------------------------------------------------------------------------------
# Defect 7: maps_from_state_dict on layouts that are not a dense row-major tensor.


def test_state_dict_refuses_sparse_and_nested_tensors() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns that sparse CSR / nested tensors are in beta
        sparse = {"emb.coo": torch.eye(4).to_sparse(), "emb.csr": torch.eye(4).to_sparse_csr(),
                  "layer.nt": torch.nested.nested_tensor([torch.zeros(2), torch.zeros(3)])}
        jagged = torch.nested.nested_tensor([torch.zeros(2), torch.zeros(3)], layout=torch.jagged)
    for key, value in [*sparse.items(), ("layer.jagged", jagged)]:
        with pytest.raises(UnsupportedLayoutError, match=rf"^{key}: "):
            maps_from_state_dict({"ok": torch.zeros(2), key: value})


def test_state_dict_keys_that_print_alike_are_refused() -> None:
    with pytest.raises(ValueError, match=r"keys 1 and '1' are both '1'"):
        maps_from_state_dict({1: torch.zeros(2), "1": torch.zeros(3, dtype=torch.float64)})
    # a skipped non-tensor does not collide with anything
    maps, sizes = maps_from_state_dict({1: 5, "1": torch.zeros(3)})
    assert maps["1"].logical_shape == (3,) and sizes == {"1": 4}


def test_state_dict_plain_location_zero_d_array() -> None:
    assert maps_from_state_dict({"a": torch.zeros(2)}, plain_location=np.array(3)).maps["a"].shard_shapes == {3: (2,)}
    both = maps_from_state_dict({"a": torch.zeros(2)}, plain_location=np.array([1, 2])).maps["a"]
    assert sorted(both.shard_shapes) == [1, 2]
    with pytest.raises(TypeError, match="plain_location"):
        maps_from_state_dict({"a": torch.zeros(2)}, plain_location=np.array(3.0))
    with pytest.raises(TypeError, match="plain_location"):
        maps_from_state_dict({"a": torch.zeros(2)}, plain_location=torch.tensor(3))


# ---------------------------------------------------------------------------------------------
# Megatron helpers and defects 2 and 8.


_meta = megatron_meta


def _tp(group: Any, **fields: Any) -> Any:
    return _meta(**{"is_tp": True, "partition_dim": 0, "partition_stride": 1, "tensor_parallel_group_ranks": group,
                    **fields})


def test_megatron_tp_group_repeating_a_rank_is_refused() -> None:
    with pytest.raises(InvalidMapError, match=r"^w on rank 0: TP group \[0, 0\] lists rank 0 twice"):
        from_megatron([[_tp([0, 0])]])
    with pytest.raises(InvalidMapError, match=r"^w on rank 1: TP group \[0, 1, 1\] lists rank 1 twice"):
        from_megatron([[_tp([0, 1])], [_tp([0, 1, 1])]])


@pytest.mark.parametrize("group", [[0, 1.9], ["0", "1"], [False, True], [0, -1], [0, None], 5, "01", [0, -10**5000]])
def test_megatron_tp_group_entries_must_be_ranks(group: Any) -> None:
    metadata = [[_tp(group)], [_tp(group)]]
    with pytest.raises(InvalidMapError, match=r"^w on rank 0: .*tensor_parallel_group_ranks"):
        from_megatron(metadata)


def test_megatron_numpy_integers_for_dim_and_stride() -> None:
    want = from_megatron([[_tp([0, 1], shape=(4, 2))], [_tp([0, 1], shape=(4, 2))]])["w"]
    for fields in ({"partition_dim": np.int64(0)}, {"partition_stride": np.int32(1)},
                   {"tensor_parallel_group_ranks": [np.int64(0), np.int64(1)]}):
        metas = []
        for _ in range(2):
            meta = _tp([0, 1], shape=(4, 2))
            for name, value in fields.items():
                setattr(meta, name, value)
            metas.append([meta])
        assert from_megatron(metas)["w"] == want
    strided = [[_tp([0, 1], shape=(4, 2), partition_stride=np.int64(2))] for _ in range(2)]
    assert from_megatron(strided)["w"] == from_megatron([[_tp([0, 1], shape=(4, 2), partition_stride=2)]
                                                         for _ in range(2)])["w"]
    with pytest.raises(InvalidMapError, match="partition_dim"):
        from_megatron([[_tp([0], partition_dim=np.bool_(False))]])
    with pytest.raises(InvalidMapError, match="partition_stride"):
        from_megatron([[_tp([0], partition_stride=np.int64(0))]])


def test_megatron_expert_without_global_index_is_worded_as_such() -> None:
    name = "decoder.layers.0.mlp.experts.local_experts.0.linear_fc1.weight"  # SequentialMLP, as 0.16.1 names it
    metas = [[_meta(name=name, is_ep=True, expert_parallel_group_ranks=[0, 1])] for _ in range(2)]
    with pytest.raises(UnsupportedLayoutError, match=rf"^{name} on rank 0: an expert parameter without a global "
                                                     r"expert index under expert parallelism \(2 EP ranks\)"):
        from_megatron(metas)


# ---------------------------------------------------------------------------------------------
# Defect 9 and the family of every error above.


def test_dcp_storage_files_of_unwritten_metadata() -> None:
    with pytest.raises(ValueError, match=r"^dcp_storage_files: .*storage_data") as info:
        dcp_storage_files(_metadata({"w": ((4,), [((0,), (4,))])}))
    assert "location=" not in str(info.value)


def test_corrupt_metadata_errors_are_in_the_refplan_family() -> None:
    """What a corrupt checkpoint raises is an ``AffineTransferError`` a caller can catch as one."""
    for md in (_metadata({"w": ((4,), [((-1,), (4,))])}), _metadata({"w": ((4,), [])})):
        with pytest.raises(AffineTransferError):
            from_dcp_metadata(md, location="chunk")


def test_a_piece_count_over_the_budget_is_refused_before_one_piece_is_built(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two strided axes of 1 000 runs each on a 2x2 mesh are 4 * 10**6 pieces: they were built (13 s,
    1.2 GiB) before ``normalize`` refused them (an outside probe, 2026-12-07). The count is the product
    of each location's runs per axis, so it is refused from that, and the builder is never reached."""
    from torch.distributed.tensor.placement_types import _StridedShard

    import refplan.interop as interop

    def never(*args: Any) -> Any:
        raise AssertionError("runs_map was called for a map over the piece budget")

    monkeypatch.setattr(interop, "runs_map", never)
    placements = [_StridedShard(0, split_factor=1000), _StridedShard(1, split_factor=1000)]
    with pytest.raises(AffineTransferError, match=r"^parameter 'w', source map: 4000000 pieces exceed "
                                                  r"max_pieces_per_map=1048576 \(refused before building"):
        interop.from_dtensor((2000, 2000), (2, 2), placements, parameter="w")
    monkeypatch.undo()
    # Under the budget it is built as before: 1 024 runs on each of two locations.
    small = interop.from_dtensor((2048,), (2,), [_StridedShard(0, split_factor=1024)])
    assert small.piece_count() == 2 * 1024
