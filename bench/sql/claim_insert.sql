-- One claim as the scheduler makes it: the ledger's unique insert of a fire.
\set n random(1, 1000000000)
INSERT INTO job_runs (id, job_name, run_key, job_type, status, payload, scheduled_at,
                      claimed_by, claimed_at, trace_id, traceparent, options, next_dispatch_at)
VALUES (gen_random_uuid(), 'bench-' || (:n % 1000), 'bench@' || :n || '-' || gen_random_uuid(), 'noop',
        'claimed', '{"k": 1}', now() - (:n % 3600) * interval '1 second', 'sched-a', now(),
        '0af7651916cd43dd8448eb211c80319c', '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01',
        '{}', now() + interval '30 seconds')
ON CONFLICT (job_name, run_key) DO NOTHING;
