"""The RDP accountant against known values."""
import math

import pytest

import pockengine as pe
from pockengine.federated.privacy import epsilon, rdp_sampled_gaussian

# (q, noise multiplier, rounds, delta) -> epsilon from Google's dp-accounting 0.6.0:
# RdpAccountant(orders=range(2, 257)).compose(PoissonSampledDpEvent(q, GaussianDpEvent(z)), T).get_epsilon(delta)
# The first is the DP-SGD MNIST setting of Abadi et al. 2016 (batch 256 of 60000, z = 1.1, 60 epochs).
KNOWN = [((256 / 60000, 1.1, 14062, 1e-5), 2.5969811785948815),
         ((0.1, 1.0, 100, 1e-5), 7.972921510380539),
         ((1.0, 5.0, 5, 1e-5), 1.9161928394128611),
         ((0.08, 1.0, 50, 1e-6), 5.569041225452077)]


@pytest.mark.parametrize("args,eps", KNOWN)
def test_epsilon_matches_dp_accounting(args, eps):
    assert epsilon(*args)[0] == pytest.approx(eps, rel=1e-9)


def test_full_participation_is_the_gaussian_mechanism():
    # q = 1: RDP of the Gaussian mechanism, a / (2 z^2), at every order
    for a in (2, 7, 64):
        assert rdp_sampled_gaussian(1.0, 1.3, a) == pytest.approx(a / (2 * 1.3 ** 2))
        assert rdp_sampled_gaussian(1.0 - 1e-12, 1.3, a) == pytest.approx(a / (2 * 1.3 ** 2), rel=1e-6)
    # and the conversion at the best integer order
    z, T, d = 5.0, 5, 1e-5
    best = min(T * a / (2 * z * z) + math.log((a - 1) / a) - (math.log(d) + math.log(a)) / (a - 1)
               for a in range(2, 257))
    assert epsilon(1.0, z, T, d)[0] == pytest.approx(best)


def test_more_noise_or_fewer_rounds_spend_less():
    assert epsilon(0.5, 2.0, 10, 1e-5)[0] < epsilon(0.5, 1.0, 10, 1e-5)[0]
    assert epsilon(0.5, 1.0, 5, 1e-5)[0] < epsilon(0.5, 1.0, 10, 1e-5)[0]
    assert epsilon(0.1, 1.0, 10, 1e-5)[0] < epsilon(0.5, 1.0, 10, 1e-5)[0]
    with pytest.raises(pe.PockError, match="sampling rate"):
        epsilon(0.0, 1.0, 1, 1e-5)
    with pytest.raises(pe.PockError, match="delta"):
        epsilon(0.5, 1.0, 1, 1.0)
