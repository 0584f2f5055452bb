"""StreamInterval (engine/stream_interval.py): vLLM's --stream-interval as its output processor sends: the first ids
at once, then every N gathered, then whatever is left at the end; logprobs travel with their ids."""

from __future__ import annotations

from detok_worker.bus.messages import TokenLogprob
from detok_worker.engine.stream_interval import StreamInterval


def entry(token_id: int) -> TokenLogprob:
    return TokenLogprob(-0.5, [token_id], [-0.5])


def test_first_ids_at_once_then_every_n_then_the_rest_at_the_end() -> None:
    gate = StreamInterval(3)
    steps = [([1], False), ([2], False), ([3], False), ([4, 5], False), ([6], False), ([7], True)]
    sent = [gate.take("r", ids, [entry(i) for i in ids], finished) for ids, finished in steps]
    assert [None if s is None else s[0] for s in sent] == [[1], None, None, [2, 3, 4, 5], None, [6, 7]]
    assert [e.top_ids for e in sent[3][1]] == [[2], [3], [4], [5]]  # type: ignore[index]
    assert gate.take("r", [8], None, False) == ([8], None)  # the rid ended: a new one with that name starts over


def test_a_request_ending_at_its_first_output_and_one_that_ends_elsewhere() -> None:
    gate = StreamInterval(4)
    assert gate.take("a", [1, 2], None, True) == ([1, 2], None)
    assert gate.take("b", [1], None, False) == ([1], None)
    assert gate.take("b", [2], None, False) is None
    gate.forget("b")  # a stop string or the client ended it: the held id is not sent
    assert gate.take("b", [9], None, False) == ([9], None)


def test_an_output_without_ids_does_not_count_as_the_first() -> None:
    gate = StreamInterval(2)
    assert gate.take("r", [], None, False) == ([], None)  # a prefill chunk: nothing yet
    assert gate.take("r", [1], None, False) == ([1], None)
    assert gate.take("r", [2], None, False) is None


def test_a_requests_own_interval_holds_where_it_is_the_larger() -> None:
    """vLLM clamps a request's stream_interval to the server's: each rid gathers by the larger of the two."""
    gate = StreamInterval(1)
    gate.ask("own", 3)
    sent = [gate.take("own", [i], None, False) for i in range(1, 6)] + [gate.take("own", [6], None, True)]
    assert [None if s is None else s[0] for s in sent] == [[1], None, None, [2, 3, 4], None, [5, 6]]
    assert [gate.take("plain", [i], None, False) for i in (1, 2)] == [([1], None), ([2], None)]
    server = StreamInterval(4)
    server.ask("small", 2)  # below the server's: the server's holds
    taken = [server.take("small", [i], None, False) for i in range(1, 6)]
    assert [None if s is None else s[0] for s in taken] == [[1], None, None, None, [2, 3, 4, 5]]
