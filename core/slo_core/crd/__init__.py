"""Pydantic models of the SLOPolicy and ModelDeployment custom resources and their CRD rendering."""
