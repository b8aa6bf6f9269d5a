"""The experiments' training configs (``--config=experiments/configs/<file>.py[:arg]``)."""
