"""The pure core: rules over plain data (inventory, plan, allocation, CDI and label content)."""
