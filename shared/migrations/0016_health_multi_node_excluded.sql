-- health: the fabric links that keep a node out of multi-node jobs (a fault of catalog
-- action exclude_multi_node: errors rising, a link trained down to a lower speed), as
-- {link: what shows it}, e.g. {"mlx5_0/1": "speed degraded: 100 of 200 Gb/s"}. The node
-- stays UP for single-node work; the placer leaves a node with any entry out of every
-- multi-node placement (gangs, spares, growth). Set and cleared by the health monitor
-- on node.fabric_fault_observed (services/health/monitor_links.py).
ALTER TABLE nodes ADD COLUMN multi_node_excluded jsonb NOT NULL DEFAULT '{}'::jsonb;
