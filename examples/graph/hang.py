"""A script that never finishes: cut at the time limit."""

import time

while True:
    time.sleep(0.1)
