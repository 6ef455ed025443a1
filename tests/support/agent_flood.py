"""A client that crowds the agent (run as an ordinary account by tests and bench/flood.py).

    agent_flood.py SOCKET IDLE BIG ROUNDS

Opens IDLE connections and holds them without sending anything, prints "flooding", then sends
BIG requests of 4 MB each, ROUNDS times (0: until killed), and waits to be killed.
"""

import socket
import sys
import time

from jobstore.agent.protocol import encode

path, idle, big, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
held = []
for _ in range(idle):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.setblocking(False)
    try:
        s.connect(path)
    except OSError:
        pass
    held.append(s)
print("flooding", flush=True)
request = encode([b"prepare_job", b"", b"X" * (4 * 1024 * 1024)])
done = 0
while big and (rounds == 0 or done < rounds):
    batch = []
    for _ in range(big):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(0.5)
        try:
            s.connect(path)
            s.sendall(request)
        except OSError:
            pass
        batch.append(s)
    if rounds == 0:
        for s in batch:
            s.close()
    else:
        held.extend(batch)
    done += 1
time.sleep(600)
