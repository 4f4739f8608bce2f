import os
import sys

# Make tests/utils.py importable as `utils` from every test module.
sys.path.insert(0, os.path.dirname(__file__))
