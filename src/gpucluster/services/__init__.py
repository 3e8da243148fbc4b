"""Services: long-running replicas of a command behind the head's gateway (issue 23).

A service is a record plus N replica jobs; each replica is an ordinary scheduled job (same
placement, GPU types, fractions, containers, accounting), told the port to listen on in $PORT.
The reconciler keeps the replicas alive and probes them; the gateway routes to the ready ones;
the autoscaler picks how many there should be.
"""
