"""Runs whose processes span nodes: node records, ``manifest merge``, topology.

* ``topology``: a capture's process records → ``command.topology`` (nodes ×
  processes, backend, rank → device, NCCL settings) and elastic restarts →
  ``outputs.segments``;
* ``merge``: node records → one manifest, the same bytes whatever order they
  come in, refused when nodes disagree on what names the run;
* ``layout``: how two topologies relate (same, equivalent, changed), for
  verify's verdict and diff's reasons;
* ``torchrun``: reading and rewriting a torchrun command line (node count,
  node rank, rendezvous endpoint), for a re-run on this machine.
"""
