"""Projections: pure reducers from events to the device, CPU, claim and pod views."""
