"""Pure-numpy reference implementations (float64 unless a contract says otherwise).

Clear over fast. Nothing here imports torch or triton.
"""
