"""What a user writes: ``Workflow`` (the mapped root, the DSL and the in-step verbs), steps,
exception policies, flow control. Verbs that act on rows call the port the engine implements."""
