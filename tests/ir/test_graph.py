"""ir/graph.py: the one dependence walk (dependents)."""
from pockengine.ir.graph import Graph, dependents


def test_dependents_follows_forward_nodes_and_stops_where_told():
    g = Graph("t")
    x = g.add_input("x", (2, 3), "f32")
    w = g.add_state("w", (4, 3), "f32", "param")
    c = g.add_state("c", (4, 3), "f32", "const")
    y = g.add("linear", [x, w, None])
    z = g.add("linear", [x, c, None])
    s = g.add("add", [y, z])
    assert dependents(g.nodes, {id(w)}) == {id(w), id(y), id(s)}
    assert dependents(g.nodes, {id(c)}) == {id(c), id(z), id(s)}
    # follow=False at y: nothing downstream of it through y
    assert dependents(g.nodes, {id(w)}, lambda n, o: o is not y) == {id(w)}


def test_index_ranges_follow_views_intersect_and_keep_a_common_ignore_index():
    from pockengine.ir.graph import index_ranges

    g = Graph("t")
    ids = g.add_input("ids", (2, 3), "i64")
    other = g.add_input("other", (6,), "i64")
    tgt = g.add_input("tgt", (6,), "i64", kind="target")
    big = g.add_state("big", (10, 4), "f32", "param")
    small = g.add_state("small", (7, 4), "f32", "param")
    g.add("embedding", [big, ids])
    flat = g.add("reshape", [ids], {"shape": (6,)})
    both = g.add("cat", [flat, other], {"dim": 0})
    g.add("embedding", [small, both])
    logits = g.add("embedding", [big, other])
    plus = g.add("add", [tgt, tgt])
    g.add("embedding", [small, plus])  # computed indices are not followed
    g.add("cross_entropy", [logits, tgt], {"ignore_index": -100, "reduction": "mean", "label_smoothing": 0.0})
    r = index_ranges(g.nodes, [ids, other, tgt])
    assert r == {id(ids): (0, 7, None), id(other): (0, 7, None), id(tgt): (0, 4, -100)}
    assert index_ranges(g.nodes[:1], [ids, other]) == {id(ids): (0, 10, None)}
