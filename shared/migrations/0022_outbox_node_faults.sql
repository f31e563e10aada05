-- The outbox keeps every event it published (nothing prunes it yet), and two metrics
-- read the node faults out of it: health's XID counts and the launcher's
-- fault-to-restart histogram, each scrape (every 15 s, in every replica). Both read
-- the whole outbox to find a few faults: 24 ms a query at 200,000 events, growing with
-- every event the cluster ever made. Each now reads the faults' own index: about 1 ms
-- at 200,000 events, growing with the faults alone.
CREATE INDEX outbox_node_faults ON outbox (id) WHERE subject = 'muster.node.fault';
