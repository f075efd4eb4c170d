"""Where decoding runs: pools of worker processes or threads, and how items travel to them.

``pool`` runs chunks of items on threads or processes (fork or fork server), and
``process_worker`` is what runs inside a worker process;
``wire`` encodes results into reusable shared-memory slots; ``memory`` trims the
heap of long-running workers; ``threads`` pins a worker to one torch thread and
stops threads that do not end; ``forks`` keeps a process forked from the
consumer away from the consumer's workers. What the fork server imports once is
named in ``pool`` (``_PRELOAD``).
"""
