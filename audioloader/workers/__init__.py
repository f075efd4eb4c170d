"""Where decoding runs: pools of worker processes or threads, and how items travel to them.

``pool`` runs chunks of items on threads or processes (fork or fork server), and
``process_worker`` is what runs inside a worker process;
``wire`` encodes results into reusable shared-memory slots; ``memory`` trims the
heap of long-running workers; ``threads`` pins a worker to one torch thread and
stops threads that do not end; ``preload`` is what the fork server imports once;
``forks`` keeps a process forked from the consumer away from the consumer's workers.
"""
