"""Federated personalization on Flower: many phones improve a shared model with sparse updates.

    python -m pockengine.federated simulate --clients 8 --rounds 5 [--scheme sparse|full]
                                            [--engine simulation|processes|inprocess]

- sparse.py: a scheme's trained elements (whole tensors, first-k-channel slices), reading and
  writing them on a trainer, FedAvg over each element's contributors (optionally DP-FedAvg).
- privacy.py: the RDP accountant of the subsampled Gaussian mechanism (user-level epsilon).
- flower.py: PockClient (a Flower NumPyClient over a PockEngine trainer and model bundle),
  SparseFedAvg (a Flower Strategy), and the engines: Flower's simulation engine (Ray), Flower's
  server loop in-process, real server/client processes on 127.0.0.1.
- data.py: the simulated users (one real licence text each).
- simulate.py / report.py: the keyboard demo's federation, its report and plot.
"""
from .privacy import epsilon, rdp_sampled_gaussian
from .sparse import Element, aggregate, program_elements, read_elements, scheme_elements, write_elements

__all__ = ["Element", "aggregate", "epsilon", "program_elements", "rdp_sampled_gaussian", "read_elements",
           "scheme_elements", "write_elements"]
