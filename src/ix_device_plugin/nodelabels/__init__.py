"""Node labels, a node service of both front ends: the node's GPU facts as Node Feature Discovery labels.

Kept in one local feature file that either mode keeps true (featurefile: the file; service: keeping it in step).
"""
