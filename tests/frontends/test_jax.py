"""JAX frontend: a JAX function and its parameter pytree train in PockEngine exactly like
`jax.grad` + optax on the same function, judged against that run in fp64 (x64 enabled) as
JAX's own fp32 run is (the idea of tests/numerics.py), sparse updates included; the trained
pytree comes back by path and predicts with the new weights."""
import numpy as np
import pytest
import torch

import pockengine as pe
from numerics import assert_fp64_close
from pockengine.ops import FULL
from pockengine.compiler.program import resolve_update

jax = pytest.importorskip("jax")
optax = pytest.importorskip("optax")
jnp = jax.numpy
lax = jax.lax


# -- models: plain functions of (params, x), parameters in nested dicts ----------------------
def mlp_init(k):
    k1, k2, k3 = jax.random.split(k, 3)
    return {"dense1": {"kernel": jax.random.normal(k1, (16, 32)) * 0.25, "bias": jnp.zeros(32)},
            "dense2": {"kernel": jax.random.normal(k2, (32, 32)) * 0.18, "bias": jnp.full(32, 0.01)},
            "out": {"kernel": jax.random.normal(k3, (32, 5)) * 0.18, "bias": jnp.zeros(5)}}


def mlp(p, x):
    h = jax.nn.relu(x @ p["dense1"]["kernel"] + p["dense1"]["bias"])
    h = jnp.tanh(h @ p["dense2"]["kernel"] + p["dense2"]["bias"])
    return h @ p["out"]["kernel"] + p["out"]["bias"]


def batch_norm(x, scale, bias, eps=1e-5):
    """Training-mode BatchNorm over N, H, W (NHWC): batch statistics, biased variance."""
    mean = x.mean(axis=(0, 1, 2))
    var = ((x - mean) ** 2).mean(axis=(0, 1, 2))
    return (x - mean) * lax.rsqrt(var + eps) * scale + bias


def conv(x, w, stride=1):
    return lax.conv_general_dilated(x, w, (stride, stride), ((1, 1), (1, 1)),
                                    dimension_numbers=("NHWC", "HWIO", "NHWC"))


def cnn_init(k):
    k1, k2, k3 = jax.random.split(k, 3)
    return {"conv1": {"kernel": jax.random.normal(k1, (3, 3, 3, 8)) * 0.3},
            "bn1": {"scale": jnp.ones(8), "bias": jnp.zeros(8)},
            "conv2": {"kernel": jax.random.normal(k2, (3, 3, 8, 16)) * 0.15},
            "bn2": {"scale": jnp.ones(16), "bias": jnp.zeros(16)},
            "head": {"kernel": jax.random.normal(k3, (16, 10)) * 0.25, "bias": jnp.zeros(10)}}


def cnn(p, x):
    h = jax.nn.relu(batch_norm(conv(x, p["conv1"]["kernel"]), p["bn1"]["scale"], p["bn1"]["bias"]))
    h = lax.reduce_window(h, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
    h = jax.nn.relu(batch_norm(conv(h, p["conv2"]["kernel"]), p["bn2"]["scale"], p["bn2"]["bias"]))
    return h.mean(axis=(1, 2)) @ p["head"]["kernel"] + p["head"]["bias"]


V, D, T, H = 32, 16, 8, 2


def layer_norm(x, g, b, eps=1e-5):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) * lax.rsqrt(var + eps) * g + b


def gpt_init(k):
    ks = jax.random.split(k, 6)
    n = lambda k, s, std: jax.random.normal(k, s) * std  # noqa: E731
    return {"embed": n(ks[0], (V, D), 0.5), "pos": n(ks[1], (T, D), 0.1),
            "ln1": {"g": jnp.ones(D), "b": jnp.zeros(D)},
            "attn": {"qkv": n(ks[2], (D, 3 * D), 0.25), "proj": n(ks[3], (D, D), 0.25)},
            "ln2": {"g": jnp.ones(D), "b": jnp.zeros(D)},
            "mlp": {"fc1": n(ks[4], (D, 4 * D), 0.25), "fc2": n(ks[5], (4 * D, D), 0.12)},
            "head": {"kernel": n(ks[5], (D, V), 0.25)}}


def gpt(p, idx):
    b, t = idx.shape
    x = p["embed"][idx] + p["pos"][:t]
    q, k, v = jnp.split(layer_norm(x, p["ln1"]["g"], p["ln1"]["b"]) @ p["attn"]["qkv"], 3, axis=-1)
    q, k, v = (z.reshape(b, t, H, D // H).transpose(0, 2, 1, 3) for z in (q, k, v))
    s = jnp.einsum("bhqd,bhkd->bhqk", q, k) / np.sqrt(D // H)
    s = jnp.where(jnp.tril(jnp.ones((t, t), bool)), s, -1e9)
    a = jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(s, axis=-1), v)
    x = x + a.transpose(0, 2, 1, 3).reshape(b, t, D) @ p["attn"]["proj"]
    x = x + jax.nn.relu(layer_norm(x, p["ln2"]["g"], p["ln2"]["b"]) @ p["mlp"]["fc1"]) @ p["mlp"]["fc2"]
    return x @ p["head"]["kernel"]


def rnn_init(k):
    ks = jax.random.split(k, 5)
    n = lambda k, s, std: jax.random.normal(k, s) * std  # noqa: E731
    return {"embed": n(ks[0], (V, D), 0.5), "cell": {"wx": n(ks[1], (D, 2 * D), 0.3),
                                                      "wh": n(ks[2], (D, 2 * D), 0.3), "b": n(ks[3], (2 * D,), 0.1)},
            "head": {"kernel": n(ks[4], (D, V), 0.25)}}


def rnn(p, idx):
    """A gated RNN over time by lax.scan; jnp.maximum of two tensors and a comparison in the cell."""
    x = p["embed"][idx].transpose(1, 0, 2)  # (T, B, D)

    def cell(h, xt):
        z = xt @ p["cell"]["wx"] + h @ p["cell"]["wh"] + p["cell"]["b"]
        gate, cand = jax.nn.sigmoid(z[:, :D]), jnp.tanh(z[:, D:])
        cand = jnp.where(cand > 0, cand, 0.1 * cand)  # a comparison
        h = jnp.maximum(gate * h + (1 - gate) * cand, -0.9 * jnp.abs(h))  # max of two tensors
        return h, h

    h0 = jnp.zeros((idx.shape[0], D), x.dtype)
    _, hs = lax.scan(cell, h0, x)
    return hs.transpose(1, 0, 2) @ p["head"]["kernel"]


def pool_init(k):
    k1, k2 = jax.random.split(k)
    return {"proj": {"kernel": jax.random.normal(k1, (16, 32)) * 0.25, "bias": jnp.full(32, 0.01)},
            "out": {"kernel": jax.random.normal(k2, (32, 5)) * 0.18}}


def pool(p, x):
    """Max and min reductions over time (jnp.max / jnp.min: reduce_max / reduce_min)."""
    h = jnp.tanh(x @ p["proj"]["kernel"] + p["proj"]["bias"])
    return (jnp.max(h, axis=1) + 0.5 * jnp.min(h, axis=1)) @ p["out"]["kernel"]


MODELS = {"mlp": (mlp_init, mlp), "cnn": (cnn_init, cnn), "gpt": (gpt_init, gpt), "rnn": (rnn_init, rnn),
          "pool": (pool_init, pool)}
SPARSE = {"mlp": {"dense2.kernel": 0.5, "out.*": 1.0},
          "cnn": {"conv2.kernel": 0.5, "bn2.*": 1.0, "head.*": 1.0},
          "gpt": {"attn.qkv": 0.5, "mlp.*": 1.0, "ln2.*": 1.0, "embed": 0.25},
          "rnn": {"cell.wh": 0.5, "cell.b": 1.0, "head.*": 1.0},
          "pool": {"proj.kernel": 0.5, "out.*": 1.0}}


def batches(name, n=3):
    g = torch.Generator().manual_seed(0)
    if name == "mlp":
        return [((torch.randn(8, 16, generator=g),), (torch.randint(0, 5, (8,), generator=g),)) for _ in range(n)]
    if name == "pool":
        return [((torch.randn(4, 6, 16, generator=g),), (torch.randint(0, 5, (4,), generator=g),))
                for _ in range(n)]
    if name == "cnn":
        return [((torch.randn(4, 8, 8, 3, generator=g),), (torch.randint(0, 10, (4,), generator=g),))
                for _ in range(n)]
    return [((torch.randint(0, V, (2, T), generator=g),), (torch.randint(0, V, (2, T), generator=g),))
            for _ in range(n)]


# -- the reference: jax.grad + optax, in fp32 and in fp64 -------------------------------------
def optax_of(opt):
    if isinstance(opt, pe.SGD):  # torch.optim.SGD: weight decay added to the gradient, then momentum
        return optax.chain(optax.add_decayed_weights(opt.weight_decay),
                           optax.sgd(opt.lr, momentum=opt.momentum or None, nesterov=opt.nesterov))
    return optax.adamw(opt.lr, b1=opt.betas[0], b2=opt.betas[1], eps=opt.eps, weight_decay=opt.weight_decay)


def jax_train(apply, params, data, update, opt, steps, dtype):
    """`steps` of jax.grad + optax; gradients masked to the updated slices, frozen slices restored."""
    from pockengine.frontends.jax import leaf_names
    names = [n for n, _ in leaf_names(params)]
    trained = resolve_update({n: tuple(np.shape(l)) for n, l in leaf_names(params)}, update)
    params = jax.tree_util.tree_map(lambda a: jnp.asarray(a, dtype), params)
    tree = jax.tree_util.tree_structure(params)

    def loss_fn(p, x, y):
        logits = apply(p, x)
        return optax.softmax_cross_entropy_with_integer_labels(
            logits.reshape(-1, logits.shape[-1]), y.reshape(-1)).mean()

    def mask(leaves, name, leaf):
        k = trained.get(name)
        return leaf if k is FULL else jnp.zeros_like(leaf) if k is None else leaf.at[:, k:].set(0)

    tx = optax_of(opt)
    state = tx.init(params)
    losses = []
    for i in range(steps):
        (x,), (y,) = data[i % len(data)]
        x = jnp.asarray(x.numpy(), dtype if x.is_floating_point() else jnp.int32)
        loss, grads = jax.value_and_grad(loss_fn)(params, x, jnp.asarray(y.numpy(), jnp.int32))
        grads = tree.unflatten([mask(None, n, g) for n, g in zip(names, tree.flatten_up_to(grads))])
        updates, state = tx.update(grads, state, params)
        new = optax.apply_updates(params, updates)
        old, new = tree.flatten_up_to(params), tree.flatten_up_to(new)
        params = tree.unflatten([n_ if trained.get(name) is FULL else o if name not in trained
                                 else n_.at[:, trained[name]:].set(o[:, trained[name]:])
                                 for name, o, n_ in zip(names, old, new)])
        losses.append(float(loss))
    return losses, {n: np.asarray(l) for n, l in zip(names, tree.flatten_up_to(params))}, params


OPTIMIZERS = {"sgd": lambda: pe.SGD(lr=0.05, momentum=0.9, weight_decay=1e-3),
              "adamw": lambda: pe.AdamW(lr=1e-3, weight_decay=0.01)}
CASES = [("mlp", "full", "adamw"), ("mlp", "sparse", "sgd"), ("cnn", "full", "sgd"), ("cnn", "sparse", "adamw"),
         ("gpt", "full", "sgd"), ("gpt", "sparse", "adamw"), ("rnn", "full", "sgd"), ("rnn", "sparse", "adamw"),
         ("pool", "full", "adamw"), ("pool", "sparse", "sgd")]


@pytest.mark.parametrize("name,scheme,opt", CASES)
def test_jax_trains_like_jax_grad_and_optax(name, scheme, opt):
    init, apply = MODELS[name]
    params = jax.tree_util.tree_map(lambda a: jnp.asarray(a, jnp.float32), init(jax.random.PRNGKey(0)))
    data = batches(name)
    update = "full" if scheme == "full" else SPARSE[name]
    prog = pe.compile(pe.from_jax(apply, params), *data[0], loss="cross_entropy", update=update,
                      optimizer=OPTIMIZERS[opt]())
    trainer = prog.build()
    losses = [trainer.step(*data[i % 3]) for i in range(3)]

    l32, s32, p32 = jax_train(apply, params, data, update, OPTIMIZERS[opt](), 3, jnp.float32)
    with jax.enable_x64(True):
        l64, s64, p64 = jax_train(apply, params, data, update, OPTIMIZERS[opt](), 3, jnp.float64)
        x64 = jnp.asarray(data[1][0][0].numpy())
        x64 = x64.astype(jnp.float64) if x64.dtype == jnp.float32 else x64
        out64 = np.asarray(apply(p64, x64))
    for i in range(3):
        assert_fp64_close([losses[i]], [l32[i]], [l64[i]], f"loss of step {i}")
    state = trainer.state_dict()
    assert set(state) == set(s64)  # pytree paths
    trained = resolve_update({n: a.shape for n, a in s64.items()}, update)
    from pockengine.frontends.jax import leaf_names
    for n, orig in leaf_names(params):
        assert_fp64_close(state[n], s32[n], s64[n], n)
        if n not in trained:
            assert np.array_equal(state[n], np.asarray(orig)), f"frozen {n} changed"
        elif trained[n] is not FULL:
            assert np.array_equal(state[n][:, trained[n]:], np.asarray(orig)[:, trained[n]:]), n

    # the trained pytree, back by path, predicts with the new weights
    new = pe.jax_params(trainer, params)
    assert jax.tree_util.tree_structure(new) == jax.tree_util.tree_structure(params)
    x = data[1][0][0].numpy()
    got = np.asarray(apply(new, x))
    assert_fp64_close(got, np.asarray(apply(p32, x)), out64, "prediction with the trained pytree")
    np.testing.assert_allclose(trainer.forward((data[1][0][0],)), got, rtol=1e-4, atol=1e-5)


def test_jax_arrays_as_example_inputs():
    """A JAX user passes jax.Array example inputs (and NumPy int64 labels): the same program as
    torch tensors.  JAX's own integer arrays are int32 (x64 off): as class targets they are
    taken as int64 (a lossless widening), the same program again; the trainer still takes the
    compiled int64 (its exact-dtype check)."""
    init, apply = MODELS["mlp"]
    params = jax.tree_util.tree_map(lambda a: jnp.asarray(a, jnp.float32), init(jax.random.PRNGKey(0)))
    (x,), (y,) = batches("mlp")[0]
    want = pe.compile(pe.from_jax(apply, params), (x,), (y,), name="jx").source()
    got = pe.compile(pe.from_jax(apply, params), (jnp.asarray(x.numpy()),), (y.numpy(),), name="jx")
    assert got.source() == want
    labels = jnp.asarray(y.numpy())
    assert labels.dtype == jnp.int32
    assert pe.compile(pe.from_jax(apply, params), (jnp.asarray(x.numpy()),), (labels,), name="jx").source() == want
    init, apply = MODELS["gpt"]  # int32 token ids and next-token labels, as JAX makes them
    params = jax.tree_util.tree_map(lambda a: jnp.asarray(a, jnp.float32), init(jax.random.PRNGKey(0)))
    (x,), (y,) = batches("gpt")[0]
    want = pe.compile(pe.from_jax(apply, params), (x,), (y,), name="jg").source()
    ids, labels = jnp.asarray(x.numpy()), jnp.asarray(y.numpy())
    assert ids.dtype == labels.dtype == jnp.int32
    assert pe.compile(pe.from_jax(apply, params), (ids,), (labels,), name="jg").source() == want
