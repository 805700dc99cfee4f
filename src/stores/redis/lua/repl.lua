-- Redis 3.2-4 refuse writes after TIME without effect replication (5+ replicate effects anyway).
if redis.replicate_commands then redis.replicate_commands() end
