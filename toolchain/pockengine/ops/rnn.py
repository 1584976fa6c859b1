"""Recurrent layers: lstm and gru (whole sequences, one kernel each) with their backward ops."""
from __future__ import annotations

from ..ir.graph import Value
from .cpp import b
from .record import OpRecord, bwd, k_of as _k, register


# ---- lstm ------------------------------------------------------------------------------
def _lstm(i, a):
    x = i[0].shape
    b, t, h, p = x[0], x[1], a["hidden"], a["proj"]
    return [((b, t, p), "f32"), ((b, p), "f32"), ((b, h), "f32"), ((t, b, 4 * h), "f32"), ((t, b, h), "f32"),
            ((t, b, h), "f32")]


def _lstm_flops(i, o, a):
    b, t, n_in = i[0].shape
    h, p = a["hidden"], a["proj"]
    return 2 * b * t * (4 * h * (n_in + p) + (p * h if a["proj"] != h else 0)) + 10 * b * t * h


def _lstm_bwd(i, a):
    x = i[3].shape
    b, t, h, p = x[0], x[1], a["hidden"], a["proj"]
    return [(x, "f32"), ((b, p), "f32"), ((b, h), "f32"), ((4 * h, a["k_ih"]), "f32"),
            ((4 * h, a["k_hh"]), "f32"), ((4 * h,), "f32"), ((4 * h,), "f32"), ((p, a["k_hr"]), "f32"),
            ((t * b * 4 * h + b * h + (t * b * p + b * h if p != h else b * p),), "f32")]  # lstm_bwd_scratch_floats


def _lstm_bwd_flops(i, o, a):
    """What the kernel computes: backpropagation through time (always: dh through W_hh and,
    with a projection, W_hr; the gate math), plus dx and each weight gradient's [:, :k] only
    when wanted (o[0] absent: no dx; k_* = 0: no weight gradient)."""
    b, t, n_in = i[3].shape
    h, p, g = a["hidden"], a["proj"], 4 * a["hidden"]
    bt = b * t
    total = 2 * bt * g * p + (2 * bt * p * h if p != h else 0) + 12 * bt * h
    total += 2 * bt * g * n_in if o[0] is not None else 0
    total += 2 * bt * g * (a["k_ih"] + a["k_hh"]) + 2 * bt * p * a["k_hr"]
    return total


def _lstm_grad(b, n, g, need):
    x, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr = n.inputs
    y, hn, cn, gates, cells, hraw = n.outputs
    attrs = n.attrs | {"k_ih": _k(need[3], w_ih.shape[1]) if need[3] else 0,
                       "k_hh": _k(need[4], w_hh.shape[1]) if need[4] else 0,
                       "k_hr": _k(need[7], w_hr.shape[1]) if need[7] else 0,
                       "has_bias": b_ih is not None}
    gy = g[0] if g[0] is not None else b.zeros(y.shape)
    outs = b.add("lstm_bwd", [gy, g[1], g[2], x, h0, c0, w_ih, w_hh, w_hr, y, gates, cells, hraw], attrs,
                 wanted=[bool(need[0]), bool(need[1]), bool(need[2]), bool(need[3]), bool(need[4]),
                         bool(need[5]), bool(need[6]), bool(need[7]), True])
    dx, dh0, dc0, dw_ih, dw_hh, db_ih, db_hh, dw_hr, _ = outs
    return [dx, dh0, dc0, dw_ih, dw_hh, db_ih, db_hh, dw_hr]


def lstm_params(x: Value, a) -> str:
    B, T, I = x.shape
    return f"{{{B}, {T}, {I}, {a['hidden']}, {a['proj']}, {b(a.get('has_bias', True))}, {b(a['proj'] != a['hidden'])}}}"


def _lstm_cpu(e, n, x, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr, y, hn, cn, gates, cells, hraw):
    p = lstm_params(n.inputs[0], n.attrs | {"has_bias": n.inputs[5] is not None})
    return (f"pk::lstm_fwd({x}, {h0}, {c0}, {w_ih}, {w_hh}, {b_ih}, {b_hh}, {w_hr}, {y}, {hn}, {cn}, {gates}, "
            f"{cells}, {hraw}, {p});")


def _lstm_bwd_cpu(e, n, dy, dhn, dcn, x, h0, c0, w_ih, w_hh, w_hr, y, gates, cells, hraw,
                  dx, dh0, dc0, dw_ih, dw_hh, db_ih, db_hh, dw_hr, scratch):
    a = n.attrs
    p = lstm_params(n.inputs[3], a)
    return (f"pk::lstm_bwd({dy}, {dhn}, {dcn}, {x}, {h0}, {c0}, {w_ih}, {w_hh}, {w_hr}, {y}, {gates}, {cells}, "
            f"{hraw}, {dx}, {dh0}, {dc0}, {dw_ih}, {dw_hh}, {db_ih}, {db_hh}, {dw_hr}, {scratch}, {p}, "
            f"{a['k_ih']}, {a['k_hh']}, {a['k_hr']});")


register(
    OpRecord("lstm", _lstm, _lstm_flops, float_only=True, grad=_lstm_grad, partial=frozenset({3, 4, 7}),
             cpu=_lstm_cpu),
    bwd("lstm_bwd", _lstm_bwd, _lstm_bwd_flops, cpu=_lstm_bwd_cpu),
)


# ---- gru -------------------------------------------------------------------------------------
def _gru(i, a):
    b, t, _ = i[0].shape
    h = a["hidden"]
    return [((b, t, h), "f32"), ((b, h), "f32"), ((t, b, 4 * h), "f32")]


def _gru_flops(i, o, a):
    b, t, n_in = i[0].shape
    return 2 * b * t * 3 * a["hidden"] * (n_in + a["hidden"]) + 10 * b * t * a["hidden"]


def _gru_bwd(i, a):
    x = i[2].shape
    b, t, h = x[0], x[1], a["hidden"]
    return [(x, "f32"), ((b, h), "f32"), ((3 * h, a["k_ih"]), "f32"), ((3 * h, a["k_hh"]), "f32"),
            ((3 * h,), "f32"), ((3 * h,), "f32"), ((t * b * 4 * h + b * h,), "f32")]  # gru_bwd_scratch_floats


def _gru_grad(b, n, g, need):
    x, h0, w_ih, w_hh, b_ih, b_hh = n.inputs
    y, hn, saved = n.outputs
    attrs = n.attrs | {"k_ih": _k(need[2], w_ih.shape[1]) if need[2] else 0,
                       "k_hh": _k(need[3], w_hh.shape[1]) if need[3] else 0,
                       "has_bias": b_ih is not None}
    gy = g[0] if g[0] is not None else b.zeros(y.shape)
    dx, dh0, dw_ih, dw_hh, db_ih, db_hh, _ = b.add(
        "gru_bwd", [gy, g[1], x, h0, w_ih, w_hh, y, saved], attrs,
        wanted=[bool(need[0]), bool(need[1]), bool(need[2]), bool(need[3]), bool(need[4]), bool(need[5]), True])
    return [dx, dh0, dw_ih, dw_hh, db_ih, db_hh]


def gru_params(x: Value, a, has_bias) -> str:
    B, T, I = x.shape
    return f"{{{B}, {T}, {I}, {a['hidden']}, {b(has_bias)}}}"


def _gru_cpu(e, n, x, h0, w_ih, w_hh, b_ih, b_hh, y, hn, saved):
    p = gru_params(n.inputs[0], n.attrs, n.inputs[4] is not None)
    return f"pk::gru_fwd({x}, {h0}, {w_ih}, {w_hh}, {b_ih}, {b_hh}, {y}, {hn}, {saved}, {p});"


def _gru_bwd_cpu(e, n, dy, dhn, x, h0, w_ih, w_hh, y, saved, dx, dh0, dw_ih, dw_hh, db_ih, db_hh, scratch):
    a = n.attrs
    p = gru_params(n.inputs[2], a, a["has_bias"])
    return (f"pk::gru_bwd({dy}, {dhn}, {x}, {h0}, {w_ih}, {w_hh}, {y}, {saved}, {dx}, {dh0}, {dw_ih}, {dw_hh}, "
            f"{db_ih}, {db_hh}, {scratch}, {p}, {a['k_ih']}, {a['k_hh']});")


register(
    OpRecord("gru", _gru, _gru_flops, float_only=True, grad=_gru_grad, partial=frozenset({2, 3}), cpu=_gru_cpu),
    bwd("gru_bwd", _gru_bwd, lambda i, o, a: 2 * _gru_flops(i[2:3], o, a), cpu=_gru_bwd_cpu),
)
