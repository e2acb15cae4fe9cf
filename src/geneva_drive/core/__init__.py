"""The bottom layer: states, errors, the clock, shutdown requests, events, settings (data only)
and the ports the layers above implement. It imports nothing else of geneva-drive."""
