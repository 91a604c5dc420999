"""Op streams: what the launcher's op recorder wrote, and where two of them part.

``stream`` reads the op streams, ``align`` lines two of them up and finds the first op
that computes differently, ``findings`` turns that into a report entry, with
``catalogue`` (the ops the installed torch documents as nondeterministic). verify
(first divergent op), explain (the whole report) and lab (the op catalogue) all stand on
this package; it imports none of them.
"""
