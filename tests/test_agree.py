"""The store agreement of a call's brief and outcome (``refplan.execute.agree``), on one
in-process store with a thread per process: the answer, the early answer that never waits for a
peer that may be dead, the timeout, the keys it leaves, and what packing ahead is told."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import pytest
from torch._C._distributed_c10d import HashStore  # torch.distributed re-exports it without declaring so

from refplan.execute import agree

pytestmark = pytest.mark.timeout(120)

SECOND = timedelta(seconds=1)


def _links(size: int, store: Any | None = None) -> list[agree._Link]:
    store = store if store is not None else HashStore()
    return [agree._Link(store, "refplan/agree/test", size, rank) for rank in range(size)]


def _together(
    links: Sequence[agree._Link], words: Sequence[Sequence[int]], *, early: Sequence[bool] | None = None,
    timeout: timedelta = timedelta(seconds=20), only: Sequence[int] | None = None,
    meanwhile: Callable[[int], Any] | None = None,
) -> dict[int, Any]:
    """Each of ``only`` (default: every link) agrees in a thread of its own; what each returned or raised."""
    out: dict[int, Any] = {}

    def run(i: int) -> None:
        try:
            out[i] = agree.agree_max(links[i], words[i], timeout, early=bool(early and early[i]),
                                     meanwhile=None if meanwhile is None else meanwhile(i))
        except Exception as exc:
            out[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in (only if only is not None else range(len(links)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return out


def test_every_process_reads_the_elementwise_maximum() -> None:
    links = _links(4)
    words = [[3, -7, 0], [9, -8, 5], [1, -2, 4], [-5, -9, 2]]
    got = _together(links, words)
    assert all(got[i][0] == [9, -2, 5] for i in range(4)), got
    # Every process counted the same agreement; the next one is another set of keys.
    assert {link.seq for link in links} == {1}
    again = _together(links, [[1], [2], [3], [0]])
    assert all(again[i][0] == [3] for i in range(4)), again


def test_an_early_answer_is_read_by_everyone_without_waiting_for_the_missing_peer() -> None:
    """Process 2 never arrives (dead); process 1's own record already settles the call (a failure),
    so it is written as the answer at once and process 0 reads it instead of waiting for 2."""
    links = _links(3)
    started = time.monotonic()
    got = _together(links, [[0], [1], [0]], early=[False, True, False], only=[0, 1])
    assert got[0][0] == [1] and got[1][0] == [1], got
    assert time.monotonic() - started < 10, "a process waited for the missing peer"


def test_an_early_answer_is_the_only_one() -> None:
    """An unsettled process's count never completes (it adds ``_UNSETTLED``), so nobody computes a
    maximum to race its early answer: every process reads that record, whoever arrives last.
    (Protocol 7 let the last arrival's maximum race it for the key.)"""
    for _ in range(20):
        links = _links(2)
        got = _together(links, [[2, 0], [1, 5]], early=[True, False])
        assert got[0][0] == got[1][0] == [2, 0], got


class _Counting:
    """A store that counts the requests of one process (a thread here) by kind."""

    def __init__(self, store: Any) -> None:
        self.store, self.calls = store, Counter[str]()

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.store, name)

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            return method(*args, **kwargs)
        return counted


def _last_arrival(
    stores: Sequence[_Counting], links: Sequence[agree._Link], words: Sequence[Sequence[int]], *, uniform: bool,
) -> tuple[dict[int, Any], dict[str, int]]:
    """Every process but the last agrees in a thread of its own and waits for the answer; then the
    last arrives in this thread. What each returned, and the requests the last one made."""
    out: dict[int, Any] = {}
    waits = [store.calls["wait"] for store in stores]
    threads = [threading.Thread(target=lambda i=i: out.__setitem__(i, agree.agree_max(
        links[i], words[i], timedelta(seconds=20), uniform=uniform))) for i in range(len(links) - 1)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 10
    while any(stores[i].calls["wait"] == waits[i] for i in range(len(threads))) and time.monotonic() < deadline:
        time.sleep(0.005)
    before = Counter(stores[-1].calls)
    out[len(threads)] = agree.agree_max(links[-1], words[-1], timedelta(seconds=20), uniform=uniform)
    made = dict(stores[-1].calls - before)
    for t in threads:
        t.join(20)
    return out, made


def test_the_last_arrival_answers_in_one_round_trip_and_a_uniform_agreement_exchanges_no_records() -> None:
    """The process that completes the count writes the answer with one ``compare_set`` from
    empty (protocol 9: a process that stopped waiting may have marked it abandoned; protocol 8's
    ``set`` would have overwritten the mark); an agreement whose settling records are all the same
    (the outcome's status word) appends none, and the count alone decides."""
    shared = HashStore()
    stores = [_Counting(shared) for _ in range(3)]
    links = [agree._Link(store, "refplan/agree/test", 3, rank) for rank, store in enumerate(stores)]
    got, made = _last_arrival(stores, links, [[0], [0], [0]], uniform=True)
    assert all(got[i][0] == [0] for i in range(3)), got
    assert made == {"set_timeout": 1, "add": 1, "compare_set": 1}, made
    assert not shared.check(["refplan/agree/test/1v/v"]), "a uniform agreement appended records"
    # Not uniform: the last arrival reads the records once (a compare_set that changes nothing).
    got, made = _last_arrival(stores, links, [[3, 1], [2, 4], [0, 0]], uniform=False)
    assert all(got[i][0] == [3, 4] for i in range(3)), got
    assert made == {"set_timeout": 1, "append": 1, "add": 1, "compare_set": 2}, made
    # A uniform agreement with a failure: the early record is everyone's answer.
    early = _together(links, [[0], [1], [0]], early=[False, True, False])
    assert all(early[i][0] == [1] for i in range(3)), early


def test_a_missing_peer_is_a_timeout_not_a_hang() -> None:
    links = _links(2)
    started = time.monotonic()
    got = _together(links, [[0], [0]], only=[0], timeout=SECOND)
    assert isinstance(got[0], Exception) and "timeout" in str(got[0]).lower(), got
    assert time.monotonic() - started < 10


def test_an_agreement_a_process_stopped_waiting_for_is_completed_by_nobody() -> None:
    """Process 0 arrives, waits 1 s and gives up; process 1 arrives after that. Its arrival
    completed the count, process 0's stale record with it, and it went on alone (before protocol 9).
    Now process 0's mark makes it raise at once; the next agreement of both is one again."""
    links = _links(2)
    first = _together(links, [[1], [1]], only=[0], timeout=SECOND)
    assert isinstance(first[0], Exception) and "timeout" in str(first[0]).lower(), first
    started = time.monotonic()
    late = _together(links, [[1], [1]], only=[1])
    assert isinstance(late[1], agree.AbandonedError), late
    assert "stopped waiting for this agreement" in str(late[1]) and time.monotonic() - started < 5
    again = _together(links, [[2], [5]])
    assert all(again[i][0] == [5] for i in range(2)), again


def test_an_answer_that_comes_while_a_process_gives_up_is_used() -> None:
    """The answer written between a process's timed-out wait and its mark wins the compare_set:
    that process reads it and returns, as the others do (no process may raise alone)."""
    shared = HashStore()
    links = _links(2, shared)

    class _LateAnswer(_Counting):
        def wait(self, keys: Any, timeout: Any) -> None:
            # The other process completes the count right as this one's wait ends with its timeout.
            agree.agree_max(links[1], [7], timedelta(seconds=5))
            raise RuntimeError("Wait timeout")

    links[0].store = _LateAnswer(shared)
    got = agree.agree_max(links[0], [3], SECOND)
    assert got[0] == [7], got


def test_the_keys_of_old_agreements_are_deleted() -> None:
    """The first process at agreement ``seq`` deletes agreement ``seq - 2``'s keys: a loop of
    agreements leaves a bounded number of keys, whatever its length."""
    store = HashStore()
    links = _links(3, store)
    for n in range(40):
        got = _together(links, [[n], [n + 1], [n - 1]])
        assert all(got[i][0] == [n + 1] for i in range(3)), (n, got)
    assert store.num_keys() <= 3 * 3, store.num_keys()


def test_a_record_of_another_size_is_an_error_everywhere_and_at_once() -> None:
    """Records of different sizes (no two processes of one protocol send them) make no answer:
    the process that would compute it raises and writes its own record, so the other reads a
    record of the wrong size and raises too, instead of waiting out its timeout."""
    links = _links(2)
    started = time.monotonic()
    got = _together(links, [[1, 2], [3]])
    assert all(isinstance(v, Exception) for v in got.values()), got
    assert time.monotonic() - started < 10, "a process waited for an answer that never came"


def test_packing_ahead_runs_while_waiting_and_is_told_when_the_answer_came() -> None:
    """The process that completes the agreement is told at once that it completed (it packs
    nothing ahead); one that waits keeps packing until the answer key appears."""
    links = _links(2)
    release = threading.Event()
    seen: dict[int, list[bool]] = {0: [], 1: []}

    def meanwhile(i: int) -> Callable[[Callable[[], bool]], frozenset[tuple[int, int, int]]]:
        def work(finished: Callable[[], bool]) -> frozenset[tuple[int, int, int]]:
            if i == 0:
                release.set()  # process 0 waits: now process 1 may arrive and complete
                deadline = time.monotonic() + 10
                while not finished() and time.monotonic() < deadline:
                    time.sleep(0.001)
            seen[i].append(finished())
            return frozenset({(i, 0, 0)})
        return work

    out: dict[int, Any] = {}
    first = threading.Thread(target=lambda: out.__setitem__(0, agree.agree_max(
        links[0], [1], timedelta(seconds=20), meanwhile=meanwhile(0))))
    first.start()
    assert release.wait(10)
    out[1] = agree.agree_max(links[1], [2], timedelta(seconds=20), meanwhile=meanwhile(1))
    first.join(20)
    assert out[0] == ([2], frozenset({(0, 0, 0)})) and out[1] == ([2], frozenset({(1, 0, 0)})), out
    assert seen == {0: [True], 1: [True]}, seen


def test_a_process_without_a_usable_store_offers_none_and_the_group_is_not_linked() -> None:
    """Without torch.distributed initialized there is no group store: the offer is 0, and a
    hello whose rows hold any 0 links nobody (every process decides from the same rows)."""

    class Group:
        pass

    group = Group()
    assert agree.offer(group) == 0
    agree.adopt(group, [0, 5], 2, 0)
    assert agree.link_of(group) is None
    other = Group()
    agree._OFFERS[other] = (HashStore(), 7)
    agree.adopt(other, [7, 0], 2, 0)  # a peer offered none
    assert agree.link_of(other) is None
    third = Group()
    agree._OFFERS[third] = (HashStore(), 7)
    agree.adopt(third, [9, 7], 2, 0)  # every process offered: the first one's nonce names the keys
    link = agree.link_of(third)
    assert link is not None and link.prefix.endswith(f"{9:x}") and link.size == 2
    # A group of more processes than the store's limit is never linked, every nonce offered or not.
    large = Group()
    agree._OFFERS[large] = (HashStore(), 7)
    agree.adopt(large, [7] * (agree._STORE_MAX_PROCESSES + 1), agree._STORE_MAX_PROCESSES + 1, 0)
    assert agree.link_of(large) is None and large not in agree._OFFERS


class _DropsEqualAppends:
    """A store whose ``append`` keeps a key unchanged when the value equals what it holds, as
    torch's ``FileStore`` does (checked on torch 2.13: two appends of the same 8 bytes leave 8)."""

    def __init__(self) -> None:
        self.inner = HashStore()
        self.lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def append(self, key: str, value: bytes) -> None:
        with self.lock:
            if self.inner.check([key]) and bytes(self.inner.get(key)) == bytes(value):
                return
            self.inner.append(key, value)


def test_identical_records_are_all_counted_on_a_store_that_merges_equal_appends() -> None:
    """Every agreed brief sends the same words from every process: on a store that merged them,
    the process completing the count read one record of two and raised, and the others read its
    own record as the answer and went on. Each record now starts with its process's rank."""
    links = _links(3, _DropsEqualAppends())
    got = _together(links, [[5, 7]] * 3)
    assert all(got[i][0] == [5, 7] for i in range(3)), got


def test_records_not_one_per_rank_fail_the_agreement_on_every_process() -> None:
    """A store that loses a record: the process completing the count cannot read one record per
    rank. It raises, and so must every peer; before, it wrote its own record as the answer, so
    its peers read an agreed brief and moved data while it raised "no data moved"."""

    class LosesRankOne(_DropsEqualAppends):
        def append(self, key: str, value: bytes) -> None:
            if int.from_bytes(bytes(value)[:8], "little") != 1:
                self.inner.append(key, value)

    links = _links(3, LosesRankOne())
    got = _together(links, [[5, 7]] * 3, timeout=timedelta(seconds=5))
    # The same error and text everywhere (the peers once read "stopped waiting ... its timeout
    # passed", which had not happened).
    assert all(type(got[i]) is agree.UnreadableRecordsError for i in range(3)), got
    assert {str(got[i]) for i in range(3)} == {"an agreement holds 48 bytes of records, not 3 of 24"}, got
    with pytest.raises(agree.UnreadableRecordsError,
                       match=r"records are from ranks \[0, 0\], not one from each of 0\.\.1"):
        agree._maximum(agree._pack([0, 1, 2]) * 2, 2, 2)
    for text in ("", "x" * 4, "x" * 3, "é" * 9):  # every length of mark is no multiple of 8 and reads back
        mark = agree._unreadable_mark(text)
        assert len(mark) % 8
        with pytest.raises(agree.UnreadableRecordsError) as caught:
            agree._answered(mark)
        assert str(caught.value) == text


def test_a_file_store_under_any_prefix_is_not_used_for_agreements(tmp_path: Any) -> None:
    from torch._C._distributed_c10d import FileStore, PrefixStore

    files = FileStore(str(tmp_path / "store"), 1)
    assert agree._file_backed(files)
    assert agree._file_backed(PrefixStore("a", PrefixStore("b", files)))
    assert not agree._file_backed(PrefixStore("a", HashStore()))
    assert not agree._file_backed(HashStore())
