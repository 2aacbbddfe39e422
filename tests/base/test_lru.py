"""What a process keeps between calls (flyarchive.lru.LRUCache): bounded by count and
weight, the least recently used going first and released before its replacement is made,
each value made once however many threads ask for it."""

from __future__ import annotations

import threading

import pytest

from flyarchive.lru import LRUCache


def test_a_kept_value_is_returned_without_making_it_again():
    made = []
    cache: LRUCache[str, list[str]] = LRUCache(2)

    first = cache.get("a", lambda: made.append("a") or ["a"])
    second = cache.get("a", lambda: made.append("a again") or ["a again"])

    assert second is first
    assert made == ["a"]


def test_the_least_recently_used_goes_first_and_is_released_before_the_new_one_is_made():
    events: list[str] = []
    cache: LRUCache[str, str] = LRUCache(2, on_evict=lambda v: events.append(f"released {v}"))
    cache.get("a", lambda: "a")
    cache.get("b", lambda: "b")
    cache.get("a", lambda: "a")  # a used last: b is the least recently used

    cache.get("c", lambda: events.append("making c") or "c")

    assert events == ["released b", "making c"]
    assert list(cache.keys()) == ["a", "c"]


def test_values_over_the_weight_bound_go_after_the_new_one_is_made_but_never_the_new_one():
    cache: LRUCache[str, int] = LRUCache(4, max_weight=10, weight=lambda v: v)
    cache.get("small", lambda: 3)
    cache.get("big", lambda: 6)

    cache.get("bigger", lambda: 8)
    cache.get("huge", lambda: 50)

    assert list(cache.keys()) == ["huge"]
    assert cache.weight() == 50


def test_a_value_whose_making_fails_is_not_kept_and_is_made_on_the_next_ask():
    cache: LRUCache[str, str] = LRUCache(2)

    with pytest.raises(RuntimeError, match="no device"):
        cache.get("a", lambda: (_ for _ in ()).throw(RuntimeError("no device")))

    assert "a" not in cache
    assert cache.get("a", lambda: "made") == "made"


def test_threads_asking_for_one_key_at_once_get_one_value_made_once():
    made = []
    gate = threading.Event()
    cache: LRUCache[str, object] = LRUCache(2)

    def make() -> object:
        gate.wait(5)
        made.append(1)
        return object()

    results: list[object] = []
    threads = [threading.Thread(target=lambda: results.append(cache.get("k", make)))
               for _ in range(4)]
    for thread in threads:
        thread.start()
    gate.set()
    for thread in threads:
        thread.join(10)

    assert len(made) == 1
    assert len(results) == 4 and all(r is results[0] for r in results)


def test_put_keeps_a_value_made_elsewhere_as_the_most_recently_used():
    events: list[str] = []
    cache: LRUCache[str, str] = LRUCache(2, on_evict=lambda v: events.append(f"released {v}"))
    cache.get("a", lambda: "a")
    cache.get("b", lambda: "b")

    cache.put("a", "a2")  # replaces a: a2 is now the most recently used
    cache.put("c", "c")  # b is the least recently used

    assert events == ["released a", "released b"]
    assert list(cache.keys()) == ["a", "c"]
    assert cache.get("a", lambda: "made") == "a2"


def test_pop_and_clear_release_what_they_forget():
    released: list[str] = []
    cache: LRUCache[str, str] = LRUCache(3, on_evict=released.append)
    for key in "abc":
        cache.get(key, lambda key=key: key)

    popped = cache.pop("b")
    cache.clear()

    assert popped == "b"
    assert released == ["b", "a", "c"]
    assert len(cache) == 0 and cache.pop("a") is None


@pytest.mark.parametrize("kwargs, message", [
    ({"max_items": 0}, "max_items must be at least 1"),
    ({"max_items": 2, "max_weight": 10}, "max_weight needs weight"),
])
def test_bounds_that_cannot_hold_anything_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LRUCache(**kwargs)
