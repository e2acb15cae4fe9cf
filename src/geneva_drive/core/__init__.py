"""The bottom layer: states, errors, the clock, shutdown requests, events, settings (data only),
the rule for text no database can store, lazy exports, and the ports the layers above
implement. It imports nothing else of geneva-drive."""
