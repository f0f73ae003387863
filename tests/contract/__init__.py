"""Tests of the contract suite as a kit (idemstore.testing), and a sixth backend that proves a
backend is one module and one registration. The suite itself lives in
``idemstore/testing/contract/``."""
