"""User-level differential privacy of DP-FedAvg: the RDP accountant of the (Poisson-)subsampled
Gaussian mechanism.

Each round samples every user with probability q, clips each sampled user's update to norm C
and adds Gaussian noise of std z*C to the sum: a subsampled Gaussian mechanism with noise
multiplier z. Its Renyi DP at integer order a (Mironov, Talwar and Zhang 2019, "Renyi
Differential Privacy of the Sampled Gaussian Mechanism", Sec. 3.3) is

    eps_a = log( sum_{k=0..a} C(a,k) (1-q)^(a-k) q^k exp((k^2 - k) / (2 z^2)) ) / (a - 1)

(a/(2 z^2) when q = 1); rounds compose by adding it, and (eps, delta)-DP follows by the
conversion of Canonne, Kamath and Steinke 2020 (Prop. 12, also used by TF Privacy, Opacus
and dp-accounting): eps = min_a  T*eps_a + log((a-1)/a) - (log(delta) + log(a)) / (a-1).
Flower samples a fixed number of clients without replacement; treating that as Poisson
sampling with q = clients per round / population is the usual approximation.
"""
from __future__ import annotations

import math

import numpy as np

from ..errors import PockError

ORDERS = tuple(range(2, 257))


def rdp_sampled_gaussian(q: float, noise_multiplier: float, order: int) -> float:
    """The RDP epsilon of one round at integer `order`."""
    if not 0 < q <= 1:
        raise PockError(f"sampling rate must be in (0, 1], got {q}")
    if noise_multiplier <= 0:
        return math.inf
    a, z2 = int(order), noise_multiplier ** 2
    if q == 1.0:
        return a / (2 * z2)
    k = np.arange(a + 1)
    log_binom = np.array([math.lgamma(a + 1) - math.lgamma(i + 1) - math.lgamma(a - i + 1) for i in k])
    terms = log_binom + (a - k) * math.log1p(-q) + k * math.log(q) + (k * k - k) / (2 * z2)
    top = terms.max()
    return float(top + math.log(np.exp(terms - top).sum())) / (a - 1)


def epsilon(q: float, noise_multiplier: float, rounds: int, delta: float,
            orders=ORDERS) -> tuple[float, int]:
    """(eps, best order) of `rounds` rounds at sampling rate q for the given delta."""
    if not 0 < delta < 1:
        raise PockError(f"delta must be in (0, 1), got {delta}")
    if rounds <= 0:
        return 0.0, orders[0]
    best = (math.inf, orders[0])
    for a in orders:
        rdp = rounds * rdp_sampled_gaussian(q, noise_multiplier, a)
        eps = rdp + math.log((a - 1) / a) - (math.log(delta) + math.log(a)) / (a - 1)
        best = min(best, (max(eps, 0.0), a))
    return best
