"""What a user writes: ``Workflow`` (the mapped root, the DSL and the in-step verbs), steps,
exception policies, flow control. Verbs that act on rows call the port the engine implements.

The one import circle of the package is here, and only in type annotations: a step, a policy
and the verbs' port are about the ``Workflow`` they belong to, and ``Workflow`` holds them.
At run time the imports go one way (workflow → steps → policy → callables).
"""
