"""Executors: where a batch's episodes are played (the runner's default is its own event loop).

`ncpbench.executors.ray` plays them in Ray worker actors; it imports Ray only when used, so
`import ncpbench` never needs the `ncpbench[ray]` extra.
"""
