from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("conversations", "0001_initial")]

    operations = [
        migrations.AddField(
            model_name="message",
            name="metadata",
            field=models.JSONField(
                blank=True,
                default=dict,
                help_text=(
                    "Structured parts of a message beside its text: an assistant's tool_calls, "
                    "a tool result's tool_call_id and name."
                ),
            ),
        ),
    ]
