"""``audioloader pack`` on a Ray cluster: `pack` runs the parts of a split pack as Ray tasks.

The runner is the tool's own module, `audioloader.tools.pack_ray` (``audioloader pack --ray`` uses it); it is
handed on here beside the other frameworks' glue::

    from audioloader.integrations import ray as al_ray

    summary = al_ray.pack("s3://bucket/lists/train.csv", "s3://bucket/shards/train", parts=64)

Ray is imported only when `pack` runs (``pip install audioloader[ray]``).
"""

from audioloader.tools.pack_ray import pack

__all__ = ["pack"]
