"""Prints a carriage-return progress line as Keras does (updates without a
newline, then the final state and a newline), on every rank."""
import sys
import time

for step in range(1, 4):
    sys.stdout.write(f"\r step {step}/3 ")
    sys.stdout.flush()
    time.sleep(0.3)
sys.stdout.write("\n")
print("done", flush=True)
