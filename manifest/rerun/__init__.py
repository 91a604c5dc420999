"""The one re-run engine: the only way any verb runs a recorded command.

verify, explain, lab and gate all go through three steps here, so the trust
rule, the path checks, the confinement and what the user sees before a run
are the same for every verb:

1. **plan** (``plan``): an immutable ``RerunPlan`` built from the manifest,
   its signature, the trust policy and the verb's overrides: argv, cwd,
   variables, inputs, outputs, runs, confinement, executor, trust. Every path
   is validated once (``paths``); the trust decision is :mod:`manifest.trust`'s
   (below every verb, as capture and merge ask it too); it is
   printed (escaped) before an untrusted manifest runs and is part of every
   verb's ``--format json`` report.
2. **workspace** (``workspace``): the scratch clone at the recorded commit
   with the stored patch, the inputs where the command looks (``inputs``), a
   locked scratch directory removed at the end (``scratch``).
3. **executor** (``executor``): runs the plan in the workspace under the
   launcher and returns the process records: confined by bubblewrap
   (``sandbox``), or unconfined under a keeper (``_guard``) so that the
   command never outlives the verb. Cluster executors plug in here.

``environment`` fills the argv's withheld values and the environment the
recorded run had; ``dispatch`` chooses the executor, above the local, node and
cluster executors, so the direction is one way: plan → workspace → executor →
cluster → dispatch.
"""
