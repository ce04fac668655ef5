"""A conversation with a tool switched on says so on its row (`Conversation.tools_on`), which
a turn reads instead of the switches."""

from typing import Any

from django.db import migrations
from django.db.models import Exists, OuterRef


def mark_conversations_with_tools_on(apps: Any, schema_editor: Any) -> None:
    Conversation = apps.get_model("conversations", "Conversation")
    ConversationTool = apps.get_model("plugins", "ConversationTool")
    switched_on = ConversationTool.objects.filter(conversation=OuterRef("pk"), enabled=True)
    Conversation.objects.filter(Exists(switched_on)).update(tools_on=True)


class Migration(migrations.Migration):
    dependencies = [
        ("plugins", "0002_message_embedding"),
        ("conversations", "0010_conversation_tools_on"),
    ]

    operations = [
        migrations.RunPython(mark_conversations_with_tools_on, migrations.RunPython.noop),
    ]
