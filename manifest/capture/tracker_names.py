"""The names tagging shares with the training-loop callbacks, without pydantic.

The callbacks run inside the user's training process and need only these names to leave
their locators (``manifest.integrations._locators``); :mod:`manifest.capture.trackers`,
which validates the locators with pydantic, is imported by ``capture`` alone (importing
it put pydantic into every training process that used a callback: ~110 ms)."""

from manifest.launch.boot._manifest_wire import TRACKERS_KEY as TRACKERS_KEY

TAG_RUN_ID = "manifest.run_id"
TAG_DIGEST = "manifest.digest"
TAG_LAUNCH_ID = "manifest.launch_id"
RUN_FILE = "manifest-run.json"
MAX_LOCATOR_BYTES = 16 * 1024
MAX_LOCATORS = 32
