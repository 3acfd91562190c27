hist:keys=a:vals=hitcount,b:sort=b.descending:size=2048 [active]
hist:keys=s,common_pid.execname:vals=hitcount,a.hex:sort=hitcount:size=2048 if b > 1 [active]
hist:keys=b.log2,a.hex:vals=hitcount:sort=a.hex:size=2048 [active]
hist:keys=b.buckets=10:vals=hitcount:sort=hitcount:size=256 [active]
