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
