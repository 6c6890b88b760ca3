"""The stdlib corpus: which files, and a split that never moves."""

from __future__ import annotations

from specexp.zoo.corpus import HELD_OUT_PERCENT, is_held_out, split_files, stdlib_files


def test_held_out_assignment_is_a_fixed_function_of_the_relative_path():
    # Pinned: changing the hash or the threshold would silently move files between train and held-out.
    assert is_held_out("heapq.py") and is_held_out("glob.py") and is_held_out("http/client.py")
    assert not is_held_out("os.py") and not is_held_out("json/decoder.py") and not is_held_out("typing.py")


def test_split_is_deterministic_and_partitions_the_corpus():
    train_a, held_a = split_files()
    train_b, held_b = split_files()
    assert [f.rel_path for f in train_a] == [f.rel_path for f in train_b]
    assert [f.rel_path for f in held_a] == [f.rel_path for f in held_b]
    everything = {f.rel_path for f in stdlib_files()}
    assert {f.rel_path for f in train_a} | {f.rel_path for f in held_a} == everything
    assert not {f.rel_path for f in train_a} & {f.rel_path for f in held_a}
    assert 0.5 * HELD_OUT_PERCENT / 100 < len(held_a) / len(everything) < 2 * HELD_OUT_PERCENT / 100


def test_corpus_leaves_out_tests_and_site_packages():
    for f in stdlib_files():
        parts = f.rel_path.split("/")
        assert f.rel_path.endswith(".py")
        assert not {"site-packages", "dist-packages", "test", "tests", "idle_test"} & set(parts), f.rel_path
