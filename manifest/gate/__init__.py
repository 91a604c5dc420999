"""``manifest gate``: the pre-merge reproducibility check.

The gate answers one question for a pull request: does the training still
reproduce, and if its weights moved, is there a recorded reason? It runs
three checks, in order, each ending ``pass``, ``fail``, ``skip`` or
``no-verdict`` with one sentence of reason:

* **determinism**: capture the smoke training (``[tool.manifest.gate]
  command``, else ``[tool.manifest] command``) in the project, then verify
  that manifest once in a scratch clone (``manifest.verify.pipeline``): the two runs
  must give bit-identical weights. On CPU this is what catches a generator
  seeded from the clock or the OS, whatever op it feeds.
* **baseline** (snapshot-test style): compare the run with the committed
  baseline manifest. Same weights: pass. Different weights: the causes are
  the ``bits`` differences of the inputs (``manifest.diff.engine``) plus the source
  files changed since the baseline's commit (``git diff`` against that
  commit, limited to ``code_paths``, leaving out the baseline, committed
  manifests and declared datasets, which are compared by digest under
  ``data``). Causes found: fail, "accept with ``--update-baseline``". No
  cause: fail as non-reproducible (an undeclared input moved the weights).
  When env or hardware differ from the baseline's in a way that can change
  bits (another runner type), the drift is reported and the weights are still
  compared: identical passes; moved weights are ``no-verdict`` (the runner may
  have moved them), judged against the baseline's noise envelope under
  ``allow_equivalent = true``, or with the drift as causes under
  ``same_env = true``. A baseline check never passes without comparing weights.
* **hygiene**: tree clean or its patch recorded, a lockfile digested,
  datasets declared and unchanged between the two runs, every determinism
  flag still in force when each process exited, the thread count pinned in
  the configuration (else it follows the runner's CPU count).

``--no-rerun`` trains nothing: it validates committed manifests (integrity,
data; ``manifest verify --no-rerun``) and their hygiene; the pre-commit hook
runs it with ``warn_hygiene`` so problems are shown without blocking.

Policy, ``[tool.manifest.gate]`` in pyproject.toml (paths relative to the
pyproject's directory; every key optional)::

    [tool.manifest.gate]
    baseline = "manifests/baseline.json"   # the committed baseline manifest
    command = ["python", "train.py", "--steps", "20"]   # default: [tool.manifest] command
    checks = ["determinism", "baseline", "hygiene"]     # which checks run
    same_env = false        # compare weights even when env/hardware drifted
    allow_equivalent = false  # another runner type passes when 'equivalent' (the baseline
                              # then carries a noise envelope, measured by --update-baseline)
    code_paths = ["."]      # what counts as code when looking for causes
    manifests = []          # more committed manifests (globs) for --no-rerun
    allow_dirty = true      # a dirty tree passes hygiene when its patch is recorded
    require_lockfile = true # hygiene: a lockfile (uv.lock, requirements*.txt, ...) is digested
    require_data = true     # hygiene: at least one dataset is declared

Exit status: 0 every check passed or was skipped (a check the mode does not
run), 1 a check failed, 2 bad configuration or input, 3 no verdict (the training
failed, an output went missing, moved weights on another environment). This module
never prints; ``manifest.cli.render_gate`` renders.
"""
